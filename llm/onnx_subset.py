"""The few fields of ONNX's protobuf messages that the LM head rewrite (logits_positions.py)
reads or writes, as message classes built at import from protobuf alone (onnxruntime's own
dependency): the `onnx` package is an exporters' extra, absent from a runtime install such as
the Docker image's. Field numbers and types are onnx.proto's; an enum is the int32 it is on the
wire. Every field not named here is kept as an unknown field and written back as it came, so a
model parsed and serialized again is the same model (tested against `onnx` itself)."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_STRING, _INT32, _INT64, _MESSAGE = _F.TYPE_STRING, _F.TYPE_INT32, _F.TYPE_INT64, _F.TYPE_MESSAGE
# message -> its fields: (name, number, type, label, message type or None)
_MESSAGES: dict[str, list[tuple[str, int, int, int, str | None]]] = {
    "AttributeProto": [
        ("name", 1, _STRING, _ONE, None),
        ("i", 3, _INT64, _ONE, None),
        ("type", 20, _INT32, _ONE, None),
    ],
    "Dimension": [("dim_value", 1, _INT64, _ONE, None), ("dim_param", 2, _STRING, _ONE, None)],
    "TensorShapeProto": [("dim", 1, _MESSAGE, _MANY, "Dimension")],
    "TensorType": [
        ("elem_type", 1, _INT32, _ONE, None),
        ("shape", 2, _MESSAGE, _ONE, "TensorShapeProto"),
    ],
    "TypeProto": [("tensor_type", 1, _MESSAGE, _ONE, "TensorType")],
    "ValueInfoProto": [("name", 1, _STRING, _ONE, None), ("type", 2, _MESSAGE, _ONE, "TypeProto")],
    "TensorProto": [("name", 8, _STRING, _ONE, None)],
    "NodeProto": [
        ("input", 1, _STRING, _MANY, None),
        ("output", 2, _STRING, _MANY, None),
        ("name", 3, _STRING, _ONE, None),
        ("op_type", 4, _STRING, _ONE, None),
        ("attribute", 5, _MESSAGE, _MANY, "AttributeProto"),
    ],
    "GraphProto": [
        ("node", 1, _MESSAGE, _MANY, "NodeProto"),
        ("initializer", 5, _MESSAGE, _MANY, "TensorProto"),
        ("input", 11, _MESSAGE, _MANY, "ValueInfoProto"),
        ("output", 12, _MESSAGE, _MANY, "ValueInfoProto"),
    ],
    "ModelProto": [("graph", 7, _MESSAGE, _ONE, "GraphProto")],
}
_PACKAGE = "ferry_onnx_subset"
INT64 = 7  # TensorProto.DataType.INT64
ATTRIBUTE_INT = 2  # AttributeProto.AttributeType.INT


def _classes() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{_PACKAGE}.proto", package=_PACKAGE, syntax="proto2"
    )
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            entry = message.field.add(name=field, number=number, type=kind, label=label)
            if type_name is not None:
                entry.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()  # its own: no clash with `onnx`'s, where loaded
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _MESSAGES
    }


_CLASSES = _classes()
ModelProto = _CLASSES["ModelProto"]
NodeProto = _CLASSES["NodeProto"]
ValueInfoProto = _CLASSES["ValueInfoProto"]
