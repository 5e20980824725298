"""The nodes of an ONNX file, read straight from its protobuf: op types, inputs and the integer
attributes, with the small integer constants the nodes read (a reduction's axes).

The server does not depend on the `onnx` package, and ONNX Runtime does not show a graph's
nodes, so this reads the few fields it needs from the wire format itself (ModelProto.graph,
GraphProto.node and .initializer, NodeProto, AttributeProto, TensorProto). The file is mapped,
not read: weights are skipped over, never copied. Subgraphs (If, Loop, Scan) are walked too.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Field numbers of onnx.proto3 that are read here.
MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INITIALIZER = 1, 5
NODE_INPUT, NODE_NAME, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 3, 4, 5, 7
NODE_OUTPUT = 2
ATTR_NAME, ATTR_I, ATTR_T, ATTR_G, ATTR_INTS, ATTR_GRAPHS = 1, 3, 5, 6, 8, 11
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_INT64_DATA, TENSOR_NAME, TENSOR_RAW = 1, 2, 7, 8, 9
INT64 = 7
# Constants larger than this are weights, not axes: never decoded.
SMALL_CONSTANT = 64

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class MalformedGraph(ValueError):
    """The file is not a protobuf that this reader can walk."""


@dataclass(frozen=True)
class GraphNode:
    op_type: str
    domain: str
    name: str
    inputs: tuple[str, ...]
    ints: dict[str, tuple[int, ...]] = field(default_factory=dict)  # int and ints attributes


@dataclass(frozen=True)
class GraphOps:
    nodes: tuple[GraphNode, ...]
    constants: dict[str, tuple[int, ...]]  # small INT64 initializers and Constant outputs

    def op_types(self) -> set[str]:
        return {node.op_type for node in self.nodes}


def read_graph_ops(path: Path) -> GraphOps:
    with path.open("rb") as file:
        # Not closed here: views into it may outlive this call until collected, and a mapping
        # with views cannot close (the garbage collector unmaps it).
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    nodes: list[GraphNode] = []
    constants: dict[str, tuple[int, ...]] = {}
    for number, _, value in _fields(memoryview(mapped)):
        if number == MODEL_GRAPH:
            _graph(_bytes(value), nodes, constants)
    return GraphOps(tuple(nodes), constants)


def _graph(view: memoryview, nodes: list[GraphNode], constants: dict[str, tuple[int, ...]]) -> None:
    for number, _, value in _fields(view):
        if number == GRAPH_NODE:
            nodes.append(_node(_bytes(value), nodes, constants))
        elif number == GRAPH_INITIALIZER:
            name, ints = _int_tensor(_bytes(value))
            if ints is not None:
                constants[name] = ints


def _node(
    view: memoryview, nodes: list[GraphNode], constants: dict[str, tuple[int, ...]]
) -> GraphNode:
    op_type = domain = name = ""
    inputs: list[str] = []
    outputs: list[str] = []
    ints: dict[str, tuple[int, ...]] = {}
    value_tensor: tuple[int, ...] | None = None
    for number, _, value in _fields(view):
        if number == NODE_OP_TYPE:
            op_type = _text(value)
        elif number == NODE_DOMAIN:
            domain = _text(value)
        elif number == NODE_NAME:
            name = _text(value)
        elif number == NODE_INPUT:
            inputs.append(_text(value))
        elif number == NODE_OUTPUT:
            outputs.append(_text(value))
        elif number == NODE_ATTRIBUTE:
            attribute, numbers, tensor = _attribute(_bytes(value), nodes, constants)
            if numbers is not None:
                ints[attribute] = numbers
            if attribute == "value" and tensor is not None:
                value_tensor = tensor
    if op_type == "Constant" and value_tensor is not None and outputs:
        constants[outputs[0]] = value_tensor
    return GraphNode(op_type, domain, name, tuple(inputs), ints)


def _attribute(
    view: memoryview, nodes: list[GraphNode], constants: dict[str, tuple[int, ...]]
) -> tuple[str, tuple[int, ...] | None, tuple[int, ...] | None]:
    name = ""
    numbers: list[int] | None = None
    tensor: tuple[int, ...] | None = None
    for number, wire, value in _fields(view):
        if number == ATTR_NAME:
            name = _text(value)
        elif number == ATTR_I and wire == VARINT:
            numbers = [_signed(_int(value))]
        elif number == ATTR_INTS:
            numbers = (numbers or []) + _ints(wire, value)
        elif number == ATTR_T:
            tensor = _int_tensor(_bytes(value))[1]
        elif number in (ATTR_G, ATTR_GRAPHS):  # a subgraph's nodes count as the graph's
            _graph(_bytes(value), nodes, constants)
    return name, None if numbers is None else tuple(numbers), tensor


def _int_tensor(view: memoryview) -> tuple[str, tuple[int, ...] | None]:
    """A TensorProto's name and, when it is a small INT64 tensor, its values."""
    name = ""
    datatype = 0
    values: list[int] = []
    raw: memoryview | None = None
    for number, wire, value in _fields(view):
        if number == TENSOR_NAME:
            name = _text(value)
        elif number == TENSOR_DATA_TYPE:
            datatype = _int(value)
        elif number == TENSOR_INT64_DATA:
            values += _ints(wire, value)
        elif number == TENSOR_RAW:
            raw = _bytes(value)
    if datatype != INT64:
        return name, None
    if raw is not None:
        if len(raw) > 8 * SMALL_CONSTANT:
            return name, None
        values = [
            int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, len(raw), 8)
        ]
    return name, tuple(values) if len(values) <= SMALL_CONSTANT else None


Value = int | memoryview


def _fields(view: memoryview) -> Iterator[tuple[int, int, Value]]:
    """(field number, wire type, value) of each field of a message; length-delimited values
    as views into `view`."""
    position, end = 0, len(view)
    while position < end:
        key, position = _varint(view, position)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, position = _varint(view, position)
            yield number, wire, value
        elif wire == LENGTH:
            size, position = _varint(view, position)
            if position + size > end:
                raise MalformedGraph("a field runs past the end of its message")
            yield number, wire, view[position : position + size]
            position += size
        elif wire == FIXED64:
            position += 8
        elif wire == FIXED32:
            position += 4
        else:
            raise MalformedGraph(f"wire type {wire} is not protobuf's")


def _varint(view: memoryview, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(view):
            raise MalformedGraph("a varint runs past the end of the file")
        byte = view[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def _ints(wire: int, value: Value) -> list[int]:
    """A repeated int64: packed (one length-delimited field) or one varint per field."""
    if wire == VARINT:
        return [_signed(_int(value))]
    packed, position, numbers = _bytes(value), 0, []
    while position < len(packed):
        number, position = _varint(packed, position)
        numbers.append(_signed(number))
    return numbers


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _int(value: Value) -> int:
    if not isinstance(value, int):
        raise MalformedGraph("expected a varint")
    return value


def _bytes(value: Value) -> memoryview:
    if isinstance(value, int):
        raise MalformedGraph("expected a length-delimited field")
    return value


def _text(value: Value) -> str:
    return bytes(_bytes(value)).decode("utf-8", "replace")
