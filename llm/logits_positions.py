"""The decoder graph made to compute logits only at the positions asked for (as vLLM's
`logits_indices`): a prompt's forward pass needs the next-token logits of its last position
only, but the builder's graph runs the LM head over every position it is given.

On SmolLM2-135M int4 the LM head (49,152 x 576) was 20 % of a 128-token prompt's forward pass
(onnxruntime's profiler); with the positions input a prompt piece of 8 to 128 tokens runs
12-19 % faster. The rewrite puts a Gather (axis 1: positions) on the LM head's input, fed by a
new graph input, `POSITIONS`: a decode step asks for its one position, a prompt piece for its
last two, and a caller that reads every position (echo, speculation's checks) for all of them.

Numerics: a row's result from a head of several rows does not depend on the others, but
onnxruntime's MatMulNBits may run other kernels for one row (M = 1), which rounded differently
on the AMD EPYC box of earlier benchmarks (ortgenai_batch.py; on this Sapphire Rapids box they
agree). So a prompt piece asks for its last two positions, never one: its last logits are then
bit-identical to the whole graph's (tested on both models), and so is every greedy text.

The graph is read and written with protobuf alone (onnx_subset.py), not the `onnx` package,
which a runtime install (the Docker image's lock) lacks; external weights are not loaded.

Only a head the rewrite understands is changed: a MatMul or MatMulNBits whose output reaches
`logits` through nothing but elementwise ops with constant other inputs (a Cast to float32, a
soft cap), which commute with picking positions. Any other graph is run as it is, every
position's logits computed (`rewrite` returns None, and the caller logs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ferry.llm import onnx_subset

POSITIONS = "ferry_logits_positions"
_HEADS = frozenset({"MatMul", "MatMulNBits"})
# Elementwise over each position: a Gather on the positions commutes with them when every
# other input is a constant (a scalar or a vector over the vocabulary).
_ELEMENTWISE = frozenset({"Cast", "Mul", "Div", "Add", "Sub", "Tanh"})


def rewrite(model_file: Path, logits: str) -> bytes | None:
    """The graph of `model_file` (its external weights left where they are) with its LM head
    computed at `POSITIONS` only, serialized; None where its head is not recognised."""
    model = onnx_subset.ModelProto()
    model.ParseFromString(model_file.read_bytes())
    graph = model.graph
    head = _lm_head(graph, logits)
    if head is None:
        return None
    hidden = head.input[0]
    picked = f"{hidden}/{POSITIONS}"
    gather = onnx_subset.NodeProto(
        input=[hidden, POSITIONS], output=[picked], name=POSITIONS, op_type="Gather"
    )
    gather.attribute.add(name="axis", i=1, type=onnx_subset.ATTRIBUTE_INT)
    head.input[0] = picked
    nodes = list(graph.node)
    graph.node.insert(nodes.index(head), gather)
    positions = graph.input.add(name=POSITIONS)
    positions.type.tensor_type.elem_type = onnx_subset.INT64
    positions.type.tensor_type.shape.dim.add(dim_param="positions")
    # The builder declares logits as [batch, sequence, vocab]: their middle is now the positions.
    for output in graph.output:
        if output.name == logits and len(output.type.tensor_type.shape.dim) > 1:
            output.type.tensor_type.shape.dim[1].dim_param = "positions"
    serialized: bytes = model.SerializeToString()
    return serialized


def _lm_head(graph: Any, logits: str) -> Any:
    producers = {out: node for node in graph.node for out in node.output}
    constants = {i.name for i in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    node = producers.get(logits)
    while node is not None and node.op_type in _ELEMENTWISE:
        varying = [i for i in node.input if i and i not in constants]
        if len(varying) != 1:
            return None
        node = producers.get(varying[0])
    if node is None or node.op_type not in _HEADS or node.input[0] in constants:
        return None
    if node.op_type == "MatMul" and node.input[1] not in constants:
        return None  # not a weight: something else than a head
    return node
