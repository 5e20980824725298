"""How a plain graph's requests may share a batch without changing any answer: decided once at
start from the graph's signature and nodes, and reported per axis (the log and /config).

- Rows stack along the batch axis: 0 unless `batch_axis` declares another (each output's rows
  then found by that axis's name). With axis 0, every input and output must have it dynamic
  (Triton's rule) and no input may name another axis as its batch (a sequence-first RNN's
  `[time, batch, ...]`). A graph whose nodes mix rows (a dynamically quantized graph's scale is
  the whole batch's; a reduction over the batch axis) runs one request at a time, never split.
- A dynamic axis is padded across requests only where padding is provably invisible: a mask
  input has the axis (the model reads the mask), or the configuration declares it padding-safe
  (`pad_axes`). Every output axis must then be tied to an input axis by name, so it can be cut
  back; one that cannot be tied turns padding off. Every other dynamic axis is bucketed: only
  requests of equal size on it batch together (Triton's rule for ragged shapes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from ferry.backends.onnx_graph_ops import GraphNode, GraphOps
from ferry.backends.tensor_signature import Signature, TensorSpec

# Names of inputs read as masks over their axes (Hugging Face's attention_mask, torch's
# key_padding_mask, Keras' mask): padding an axis they share is what they hide.
MASK_NAME = re.compile(r"mask", re.IGNORECASE)
BATCH_NAME = re.compile(r"^(n|b|bs|batch.*|.*_batch(_size)?|num_rows|rows)$", re.IGNORECASE)

# Nodes whose answer for one row depends on the other rows of the batch. ONNX Runtime's
# quantize_dynamic computes one scale over the whole input (DynamicQuantizeLinear and the
# contrib ops that fold it in).
NEIGHBOUR_OPS = frozenset(
    {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QAttention"}
)
# Reductions (their `axes`, attribute or constant input) and ops along one `axis`: across rows
# when they include axis 0, or reduce every axis.
KINDS = ("Mean", "Sum", "Max", "Min", "Prod", "L1", "L2", "LogSum", "LogSumExp", "SumSquare")
REDUCTIONS = frozenset(f"Reduce{kind}" for kind in KINDS)
ALONG_AXIS = frozenset(
    {"Softmax", "LogSoftmax", "Hardmax", "ArgMax", "ArgMin", "CumSum", "TopK", "LpNormalization"}
)

# What batches a graph whose first axis is fixed.
FIXED_AXIS_FIX = (
    "re-export with a dynamic batch axis (`ferry export sklearn` declares one for scikit-learn, "
    "XGBoost and LightGBM models), or set that axis to a named dim in the graph "
    "(onnx: `<tensor>.type.tensor_type.shape.dim[0].dim_param = 'N'`)"
)

Rule = Literal["batch", "pad", "bucket", "whole"]


@dataclass(frozen=True)
class AxisRule:
    tensor: str
    axis: int
    name: str  # the axis's name in the graph (or the one Ferry gave an unnamed axis)
    rule: Rule  # batch: rows stack; pad: padded; bucket: equal sizes only; whole: not batched
    why: str

    def line(self) -> str:
        return f"{self.tensor}[{self.axis}] ({self.name}): {self.rule}, {self.why}"


@dataclass(frozen=True)
class BatchPlan:
    batched: bool  # rows of several requests stack along the batch axis
    padded: frozenset[str]  # the axis names requests pad along
    axes: tuple[AxisRule, ...]  # every input axis (in the graph's positions)
    why_alone: str = ""  # when not batched
    batch_axis: int = 0  # the inputs' axis of rows (batch_axis)
    # Where the batch axis is not 0: each tensor's axis of rows, and the signature with that
    # axis moved first, which requests are checked and batched by (batch_first / graph_layout).
    rows_axes: dict[str, int] = field(default_factory=dict)
    rows_signature: Signature | None = None

    def summary(self) -> str:
        if self.batched:
            return f"batched along axis {self.batch_axis}"
        return f"one request at a time: {self.why_alone}"


UNSTARTED = BatchPlan(False, frozenset(), (), "not started")


def plan_batching(
    signature: Signature,
    ops: GraphOps | None,
    *,
    pad_axes: tuple[str, ...] | None = None,
    mask_inputs: tuple[str, ...] | None = None,
    batch_axis: int = 0,
    accept_neighbour_dependence: bool = False,
    unpaddable: Iterable[str] = (),
) -> BatchPlan:
    """`ops`: the graph's nodes (None: not read, nothing detected). `unpaddable`: axes never
    padded whatever is declared (an image input's height and width)."""
    rows_axes, why_alone = _rows_axes(signature, batch_axis)
    if not why_alone and ops is not None and not accept_neighbour_dependence:
        mixing = neighbour_dependent_nodes(ops, batch_axis)
        if mixing:
            why_alone = (
                f"node {mixing[0]} computes across rows, so an answer would depend on its "
                "neighbours; accept_neighbour_dependence = true batches it anyway"
            )
    if why_alone:
        axes = tuple(
            AxisRule(spec.name, position, name, "whole", why_alone)
            for spec in signature.inputs
            for position, name in enumerate(spec.shape)
            if isinstance(name, str)
        )
        return BatchPlan(False, frozenset(), axes, why_alone, batch_axis)
    moved = {name: axis for name, axis in rows_axes.items() if axis}
    view = batch_first(signature, moved)
    padded, why_pad = _padded_axes(view, pad_axes, mask_inputs, set(unpaddable))
    rules: list[AxisRule] = []
    for spec in view.inputs:
        order = _order(len(spec.shape), moved.get(spec.name, 0))
        for position, name in enumerate(spec.shape):
            if not isinstance(name, str):
                continue
            axis = order[position]  # in the graph's own positions
            if position == 0:
                rules.append(AxisRule(spec.name, axis, name, "batch", "rows of requests stack"))
            elif name in padded:
                rules.append(AxisRule(spec.name, axis, name, "pad", why_pad[name]))
            else:
                rules.append(AxisRule(spec.name, axis, name, "bucket", why_pad[name]))
    return BatchPlan(True, padded, tuple(rules), "", batch_axis, moved, view if moved else None)


def batch_first(signature: Signature, rows_axes: dict[str, int]) -> Signature:
    """`signature` with each tensor's axis of rows (`rows_axes`, default 0) moved first."""
    if not rows_axes:
        return signature

    def moved(spec: TensorSpec) -> TensorSpec:
        order = _order(len(spec.shape), rows_axes.get(spec.name, 0))
        return replace(spec, shape=tuple(spec.shape[i] for i in order))

    return replace(
        signature,
        inputs=tuple(map(moved, signature.inputs)),
        outputs=tuple(map(moved, signature.outputs)),
    )


def _order(rank: int, axis: int) -> list[int]:
    """The graph's axis at each position once `axis` is moved first (np.moveaxis(a, axis, 0))."""
    return [axis, *(i for i in range(rank) if i != axis)]


def _rows_axes(signature: Signature, batch_axis: int) -> tuple[dict[str, int], str]:
    """Each tensor's axis of rows, or why the graph cannot stack requests' rows."""
    if batch_axis:
        return _declared_rows_axes(signature, batch_axis)
    for spec in signature.inputs:
        axis = _batch_elsewhere(spec)
        if axis is not None:
            return {}, (
                f"input {spec.name!r} names axis {axis} ({spec.shape[axis]!r}) as its batch, "
                f"not axis 0 ({spec.shape[0]!r}); set batch_axis = {axis} to batch along it"
            )
    fixed = [
        f"{side} {spec.name!r} declares axis 0 = {spec.shape[0]}"
        if spec.shape
        else f"{side} {spec.name!r} declares no axes (a scalar)"
        for side, specs in (("input", signature.inputs), ("output", signature.outputs))
        for spec in specs
        if not spec.class_map and not (spec.shape and isinstance(spec.shape[0], str))
    ]
    if fixed:  # onnxmltools' LightGBM graphs declare their `label` output [1]
        return {}, f"{', '.join(fixed)}; {FIXED_AXIS_FIX}"
    return {}, ""


def _declared_rows_axes(signature: Signature, batch_axis: int) -> tuple[dict[str, int], str]:
    """batch_axis = k: every input's axis k is one dynamic axis the graph names, and every
    output has exactly one axis of that name (where its rows come back)."""
    names = set()
    for spec in signature.inputs:
        if len(spec.shape) <= batch_axis or not isinstance(spec.shape[batch_axis], str):
            return (
                {},
                f"batch_axis = {batch_axis}, but input {spec.name!r} has no dynamic axis there",
            )
        names.add(spec.shape[batch_axis])
    name = names.pop() if len(names) == 1 else None
    if name is None or any(name in spec.unnamed for spec in signature.inputs):
        return {}, (
            f"batch_axis = {batch_axis}: the inputs do not share one named axis there, so no "
            "output's rows can be found"
        )
    axes = {spec.name: batch_axis for spec in signature.inputs}
    for spec in signature.outputs:
        found = [i for i, d in enumerate(spec.shape) if d == name]
        if len(found) != 1 or spec.class_map:
            return {}, f"batch_axis = {batch_axis}: output {spec.name!r} has no one axis {name!r}"
        axes[spec.name] = found[0]
    return axes, ""


def _batch_elsewhere(spec: TensorSpec) -> int | None:
    """The axis past the first that `spec` names like a batch, where its first is not."""
    first = spec.shape[0] if spec.shape else None
    if isinstance(first, str) and BATCH_NAME.match(first):
        return None
    for position, name in enumerate(spec.shape[1:], start=1):
        if isinstance(name, str) and name not in spec.unnamed and BATCH_NAME.match(name):
            return position
    return None


def neighbour_dependent_nodes(ops: GraphOps, rows_axis: int = 0) -> list[str]:
    """The nodes (as `op 'name'`) whose answer for a row depends on the batch's other rows."""
    return [
        f"{node.op_type} {node.name!r}" if node.name else node.op_type
        for node in ops.nodes
        if _mixes_rows(node, ops, rows_axis)
    ]


def _mixes_rows(node: GraphNode, ops: GraphOps, rows_axis: int) -> bool:
    if node.op_type in NEIGHBOUR_OPS:
        return True
    if node.op_type in REDUCTIONS:
        return _reduces_rows(node.ints, node.inputs, ops, rows_axis)
    if node.op_type in ALONG_AXIS:
        return node.ints.get("axis", (-1,))[0] == rows_axis
    return node.op_type == "BatchNormalization" and node.ints.get("training_mode") == (1,)


def _reduces_rows(
    ints: dict[str, tuple[int, ...]], inputs: tuple[str, ...], ops: GraphOps, rows_axis: int
) -> bool:
    axes = ints.get("axes")
    if axes is None and len(inputs) > 1 and inputs[1]:
        axes = ops.constants.get(inputs[1])
        if axes is None:  # computed at run time: nothing can be said
            return False
    if not axes:  # every axis, unless told to do nothing
        return ints.get("noop_with_empty_axes") != (1,)
    return rows_axis in axes


def _padded_axes(
    signature: Signature,
    declared: tuple[str, ...] | None,
    mask_inputs: tuple[str, ...] | None,
    unpaddable: set[str],
) -> tuple[frozenset[str], dict[str, str]]:
    """The axes requests pad along, and why each dynamic axis is or is not."""
    candidates = {
        name
        for spec in signature.inputs
        for position, name in enumerate(spec.shape)
        if position >= 1 and isinstance(name, str)
    }
    why: dict[str, str] = {}
    if declared is not None:
        for name in candidates:
            why[name] = "declared in pad_axes" if name in declared else "not in pad_axes"
        return frozenset(set(declared) & candidates), why
    masks = [
        s
        for s in signature.inputs
        if (s.name in mask_inputs if mask_inputs is not None else MASK_NAME.search(s.name))
    ]
    unnamed = {name for spec in signature.inputs for name in spec.unnamed}
    padded: set[str] = set()
    for name in candidates:
        mask = next((m for m in masks if name in m.named_axes()), None)
        if name in unnamed:
            why[name] = "unnamed in the graph, so no output can be tied to it: equal sizes only"
        elif name in unpaddable:
            why[name] = "an image's height or width: padding would change its answers"
        elif mask is not None:
            padded.add(name)
            why[name] = f"shared with mask input {mask.name!r}, which hides the padding"
        else:
            why[name] = "no mask input hides padding on it: equal sizes only"
    untied = _untied_output_axis(signature, candidates)
    if padded and untied:
        for name in padded:
            why[name] = f"{untied} could not be cut back: equal sizes only"
        padded = set()
    return frozenset(padded), why


def _untied_output_axis(signature: Signature, input_axes: set[str]) -> str:
    """An output axis whose length no input axis sets (so a padded one could not be cut)."""
    for spec in signature.outputs:
        if spec.class_map:
            continue
        for position, name in enumerate(spec.shape):
            if position >= 1 and isinstance(name, str) and name not in input_axes:
                return f"output {spec.name!r} axis {position} ({name})"
    return ""
