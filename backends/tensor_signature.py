"""A plain ONNX graph's signature, read from the graph (Triton's AutoCompleteConfig): the names,
datatypes and shapes of its inputs and outputs, and which axes are dynamic and what they are
called. Nothing is assumed about what the model computes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, cast

import numpy as np

# ONNX Runtime's element types -> KServe v2 datatypes and numpy dtypes.
DATATYPES: dict[str, tuple[str, type]] = {
    "tensor(bool)": ("BOOL", np.bool_),
    "tensor(int8)": ("INT8", np.int8),
    "tensor(int16)": ("INT16", np.int16),
    "tensor(int32)": ("INT32", np.int32),
    "tensor(int64)": ("INT64", np.int64),
    "tensor(uint8)": ("UINT8", np.uint8),
    "tensor(uint16)": ("UINT16", np.uint16),
    "tensor(uint32)": ("UINT32", np.uint32),
    "tensor(uint64)": ("UINT64", np.uint64),
    "tensor(float16)": ("FP16", np.float16),
    "tensor(float)": ("FP32", np.float32),
    "tensor(double)": ("FP64", np.float64),
    "tensor(string)": ("BYTES", np.object_),
    # No numpy dtype: its raw bits, in uint16 (backends/bfloat16.py).
    "tensor(bfloat16)": ("BF16", np.uint16),
}
# A sequence of maps, one per row (scikit-learn's ZipMap): served as an [N, C] FP32 tensor.
CLASS_MAPS = ("seq(map(int64,tensor(float)))", "seq(map(string,tensor(float)))")
# Triton's model-config names of the KServe datatypes.
CONFIG_TYPES = {d: "TYPE_STRING" if d == "BYTES" else f"TYPE_{d}" for d, _ in DATATYPES.values()}

Dim = int | str  # a fixed size, or the name of a dynamic axis


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # KServe's name: FP32, INT64, BYTES, ...
    shape: tuple[Dim, ...]  # dynamic axes by name; unnamed ones are named "<tensor>:<axis>"
    class_map: bool = False  # a ZipMap output: [N, C] on KServe, {class: p} on /predict
    # The names given here to the graph's unnamed dynamic axes: no other tensor shares them,
    # so an output cannot be cut back along them (never padded unless configured).
    unnamed: frozenset[str] = frozenset()
    # Narrower datatypes a request may send instead, widened to this one when decoded (a token
    # model's ids as INT32, as tritonclient's examples send them).
    widens: frozenset[str] = frozenset()

    @cached_property  # read for every request's every input
    def dtype(self) -> np.dtype:
        if self.class_map:
            return np.dtype(np.float32)
        return np.dtype(next(t for d, t in DATATYPES.values() if d == self.datatype))

    def axis_names(self) -> dict[int, str]:
        """The dynamic axes (by position) past the first: what padding may act on."""
        return {i: d for i, d in enumerate(self.shape) if i > 0 and isinstance(d, str)}

    def named_axes(self) -> set[str]:
        """Those of `axis_names` the graph itself names."""
        return set(self.axis_names().values()) - self.unnamed

    def metadata_shape(self) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in self.shape]


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # Inputs that also take encoded images (BYTES, one per row), which the model's preprocessing
    # decodes into the graph's tensor (server/image_inputs.py).
    images: frozenset[str] = frozenset()

    @property
    def batchable(self) -> bool:
        """Triton's rule: the first axis of every input and output is dynamic."""
        specs = (*self.inputs, *self.outputs)
        return all(s.class_map or (s.shape and isinstance(s.shape[0], str)) for s in specs)

    # Read for every request: worked out once (a frozen instance's fields never change).
    def input(self, name: str) -> TensorSpec:
        return self._inputs_by_name[name]

    def output(self, name: str) -> TensorSpec:
        return self._outputs_by_name[name]

    @cached_property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    @cached_property
    def _inputs_by_name(self) -> dict[str, TensorSpec]:
        return {s.name: s for s in self.inputs}

    @cached_property
    def _outputs_by_name(self) -> dict[str, TensorSpec]:
        return {s.name: s for s in self.outputs}


class UnsupportedGraph(ValueError):
    """A graph with an input or output Ferry cannot serve (named in the message)."""


def read_signature(session: Any) -> Signature:
    """From an ONNX Runtime InferenceSession."""
    return Signature(
        tuple(_spec(node, output=False) for node in session.get_inputs()),
        tuple(_spec(node, output=True) for node in session.get_outputs()),
    )


def _spec(node: Any, output: bool) -> TensorSpec:
    if output and node.type in CLASS_MAPS:
        return TensorSpec(node.name, "FP32", (f"{node.name}:0", f"{node.name}:1"), class_map=True)
    if node.type not in DATATYPES:
        side = "output" if output else "input"
        message = f"{side} {node.name!r} has type {node.type}, which Ferry cannot serve"
        raise UnsupportedGraph(message)
    dims = _dims(node.name, node.shape)
    # Only generated names differ from the graph's dims, and those are strings.
    unnamed = cast(
        frozenset[str],
        frozenset(d for d, given in zip(dims, node.shape, strict=True) if d != given),
    )
    return TensorSpec(node.name, DATATYPES[node.type][0], dims, unnamed=unnamed)


def _dims(name: str, shape: Sequence[Any]) -> tuple[Dim, ...]:
    return tuple(
        d if isinstance(d, int) and d >= 0 else d if isinstance(d, str) and d else f"{name}:{i}"
        for i, d in enumerate(shape)
    )
