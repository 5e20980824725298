"""KServe v2 tensors of any datatype, by a model's signature: request inputs read, outputs written.

Each input is checked against the graph (its name, then its datatype) and its shape against the
data the request could carry, before its data is read;
JSON data goes through the same typed check as /predict (tensor_inputs.py), binary data must be
exactly the bytes its shape and datatype take. Outputs go back in the graph's datatypes (FP16
as JSON numbers too); a ZipMap output is its [N, C] FP32 tensor.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace
from typing import Any

import numpy as np

from ferry.backends import bfloat16
from ferry.backends.tensor_signature import Signature, TensorSpec
from ferry.server.errors import InvalidInput, MalformedRequest
from ferry.server.kserve.shared_memory import TenantRegions, TensorRef, tensor_ref
from ferry.server.tensor_inputs import MAX_DIMS, typed_array, typed_tensor


def parameters(entry: dict[str, Any]) -> dict[str, Any]:
    value = entry.get("parameters") or {}
    if not isinstance(value, dict):
        raise MalformedRequest("'parameters' must be an object")
    return value


def binary_data_size(name: str, spec: dict[str, Any]) -> int | None:
    """An input's `parameters.binary_data_size`: None when absent, else its bytes (an integer,
    as Triton takes it: a string or a list is refused naming the input)."""
    size = parameters(spec).get("binary_data_size")
    if size is None:
        return None
    if type(size) is not int or size < 0:
        raise InvalidInput(
            name, f"parameters.binary_data_size must be a count of bytes, got {size!r:.40}"
        )
    return size


def deserialize_bytes(buffer: bytes, name: str) -> np.ndarray:
    """Triton's BYTES wire format (each element: 4-byte little-endian length, then the bytes)."""
    items, offset = [], 0
    while offset < len(buffer):
        if offset + 4 > len(buffer):
            raise InvalidInput(name, "BYTES data ends inside an element's length prefix")
        (size,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        if offset + size > len(buffer):
            raise InvalidInput(name, "BYTES element runs past the end of the data")
        items.append(buffer[offset : offset + size])
        offset += size
    return np.array(items, dtype=object)


def checked_shape(name: str, shape: list[int], room: int) -> list[int]:
    """`shape`, refused before anything is allocated for it: a negative dimension, more than
    MAX_DIMS axes, or more values than `room` (what the request sent: a value takes at least a
    byte, in JSON as in binary) could hold. A zero dimension counts as one: numpy cannot even
    describe [2**63, 0]."""
    if len(shape) > MAX_DIMS:
        raise InvalidInput(name, f"shape has {len(shape)} dimensions, more than {MAX_DIMS}")
    if any(d < 0 for d in shape):
        raise InvalidInput(name, f"shape {shape} has a negative dimension")
    if math.prod(d or 1 for d in shape) > room:
        raise InvalidInput(
            name, f"shape {shape} holds more values than the request's {room} bytes can carry"
        )
    return shape


def input_region(spec: Any) -> TensorRef | None:
    """The region an input's parameters put it in (None: its data is in the request)."""
    if not isinstance(spec, dict):
        return None  # refused by input_spec
    return tensor_ref(str(spec.get("name")), parameters(spec))


def region_bytes(
    regions: TenantRegions, ref: TensorRef, name: str, datatype: str, in_request: bool
) -> bytes | memoryview:
    """An input's bytes from its region; `in_request`: the request carries data for it too."""
    if in_request:
        raise InvalidInput(name, "data both in the request and in a shared memory region")
    return regions.read(ref, name, datatype)


def decode_tensors(
    header: dict[str, Any],
    body: bytes,
    offset: int,
    signature: Signature,
    regions: TenantRegions,
) -> dict[str, np.ndarray]:
    """The header's inputs (binary ones read from `body` from `offset` on, others from their
    shared memory regions), each as an array of the graph's datatype in the request's shape."""
    tensors: dict[str, np.ndarray] = {}
    for spec in header["inputs"]:
        # Most inputs carry no parameters: no region and no binary size to read then.
        plain = type(spec) is dict and "parameters" not in spec
        ref = None if plain else input_region(spec)
        name, shape, datatype = input_spec(spec, len(body) + (ref.byte_size if ref else 0))
        want = _known_input(signature, tensors, name, datatype)
        count = math.prod(shape)
        size = None if plain else binary_data_size(name, spec)
        raw = name in signature.images
        if ref is not None:
            in_request = size is not None or "data" in spec
            chunk = region_bytes(regions, ref, name, datatype, in_request)
            array = _binary(name, datatype, want.dtype, chunk, count, shape, raw=raw)
        elif size is not None:
            chunk = body[offset : offset + size]
            offset += size
            if len(chunk) != size:
                raise InvalidInput(name, "binary data runs past the end of the body")
            array = _binary(name, datatype, want.dtype, chunk, count, shape, raw=raw)
        elif "data" in spec:
            array = typed_tensor(name, datatype, want.dtype, spec["data"]).reshape(-1)
        else:
            raise InvalidInput(name, "needs 'data' or parameters.binary_data_size")
        tensors[name] = _fitted(name, array, shape, want.datatype, signature)
    return tensors


def _fitted(
    name: str, array: np.ndarray, shape: list[int], sent: str, signature: Signature
) -> np.ndarray:
    """`array` in the request's shape, widened to the input's datatype where it was sent in a
    narrower one the input takes (`TensorSpec.widens`)."""
    if array.size != math.prod(shape):
        raise InvalidInput(name, f"{array.size} values do not fit shape {shape}")
    spec = signature.input(name)
    if sent in spec.widens:
        array = array.astype(spec.dtype)
    return array.reshape(shape)


def _binary(
    name: str,
    datatype: str,
    dtype: np.dtype,
    chunk: bytes | memoryview,
    count: int,
    shape: list[int],
    raw: bool = False,  # BYTES kept as bytes: encoded images
) -> np.ndarray:
    if datatype == "BYTES":
        items = deserialize_bytes(bytes(chunk), name)  # a region's BYTES are bytes already
        return np.array(items, dtype=object) if raw else _texts(name, items)
    expected = count * dtype.itemsize
    if len(chunk) != expected:
        raise InvalidInput(
            name,
            f"{len(chunk)} bytes of binary data, but shape {shape} of {datatype} takes {expected}",
        )
    return np.frombuffer(chunk, dtype=dtype.newbyteorder("<"))


def _texts(name: str, items: Any) -> np.ndarray:
    """BYTES elements as text, refused (not mended) where one is not UTF-8."""
    try:
        return np.array([item.decode() for item in items], dtype=object)
    except UnicodeDecodeError:
        raise InvalidInput(name, "BYTES data must be UTF-8") from None


def tensor_blob(value: np.ndarray, datatype: str) -> bytes:
    """Triton's binary tensor data: little-endian values, BYTES length-prefixed."""
    if datatype == "BYTES":
        items = [v if isinstance(v, bytes) else str(v).encode() for v in value.ravel()]
        return b"".join(struct.pack("<I", len(item)) + item for item in items)
    return np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()


def tensor_json(value: np.ndarray, datatype: str) -> Any:
    """A flat list (or array) the JSON encoder writes; FP16 and strings as plain values."""
    if datatype == "FP16":
        return value.astype(np.float32).ravel()
    if datatype == "BF16":  # its bits as the numbers they stand for
        return bfloat16.to_float32(value).ravel()
    if datatype == "BYTES":
        return [v.decode() if isinstance(v, bytes) else str(v) for v in value.ravel()]
    return value.ravel()


# gRPC: typed contents of each datatype (FP16 and BF16 have none: raw contents only, as in
# Triton).
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def check_raw_alone(request: Any) -> None:
    """Raw contents, or typed contents, never both in one request (Triton's rule, in its
    words: its clients match them)."""
    if not request.raw_input_contents:
        return
    for tensor in request.inputs:
        if tensor.contents.ListFields():
            raise InvalidInput(
                tensor.name,
                "contents field must not be specified when using raw_input_contents for "
                f"'{tensor.name}' for model '{request.model_name}'",
            )


def proto_parameters(parameters: Any) -> dict[str, Any]:
    """A protobuf map of InferParameter as plain values (whichever field each was sent in)."""
    values = {}
    for name, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        values[name] = None if choice is None else getattr(value, choice)
    return values


def grpc_regions(request: Any) -> tuple[list[TensorRef | None], dict[int, bytes]]:
    """Each input's region (None: in the request), and the raw contents of those in the
    request by input index: raw contents come only for those (tritonclient's order)."""
    refs = [tensor_ref(t.name, proto_parameters(t.parameters)) for t in request.inputs]
    raw = list(request.raw_input_contents)
    in_request = [index for index, ref in enumerate(refs) if ref is None]
    if raw and len(raw) != len(in_request):
        raise InvalidInput(
            "raw_input_contents",
            "one raw content per input is required (but none for an input in shared memory)",
        )
    return refs, dict(zip(in_request, raw, strict=False))


def decode_grpc_tensors(
    request: Any, signature: Signature, regions: TenantRegions
) -> dict[str, np.ndarray]:
    """A ModelInferRequest's inputs (raw contents, typed contents of the datatype's own field,
    or a shared memory region), checked against the graph as on HTTP."""
    check_raw_alone(request)  # first, as Triton: its clients match its words for this case
    refs, raw = grpc_regions(request)
    tensors: dict[str, np.ndarray] = {}
    room = request.ByteSize()
    for index, tensor in enumerate(request.inputs):
        name, datatype = tensor.name, tensor.datatype
        want = _known_input(signature, tensors, name, datatype)
        ref = refs[index]
        shape = checked_shape(name, list(tensor.shape), room + (ref.byte_size if ref else 0))
        count = math.prod(shape)
        used = [field.name for field, _ in tensor.contents.ListFields()]
        if ref is not None:
            chunk = region_bytes(regions, ref, name, datatype, bool(used))
            images = name in signature.images
            array = _binary(name, datatype, want.dtype, chunk, count, shape, raw=images)
        elif raw:
            array = _binary(
                name, datatype, want.dtype, raw[index], count, shape, raw=name in signature.images
            )
        else:
            field = CONTENTS.get(datatype)
            wrong = [f for f in used if f != field]
            if field is None or wrong:
                where = f"contents.{field}" if field else "raw_input_contents only"
                got = f", got {wrong[0]}" if wrong else ""
                raise InvalidInput(name, f"{datatype} data goes in {where}{got}")
            items = list(getattr(tensor.contents, field))
            if datatype == "BYTES" and name in signature.images:
                array = np.array(items, dtype=object)  # encoded images: bytes as sent
            elif datatype == "BYTES":
                array = _texts(name, items)
            else:
                array = typed_array(name, datatype, want.dtype, items)
        tensors[name] = _fitted(name, array, shape, want.datatype, signature)
    return tensors


def input_spec(spec: dict[str, Any], room: int) -> tuple[str, list[int], str]:
    """An input's name, shape and datatype from the request header's entry for it; `room`: the
    body's bytes, which the shape's values must fit in."""
    try:
        name, shape, datatype = spec["name"], [int(d) for d in spec["shape"]], spec["datatype"]
    except (KeyError, TypeError, ValueError):
        raise MalformedRequest("each input needs 'name', 'shape' and 'datatype'") from None
    return name, checked_shape(str(name), shape, room), datatype


def _known_input(
    signature: Signature, tensors: dict[str, np.ndarray], name: str, datatype: str
) -> TensorSpec:
    """The graph's spec of input `name`, once given and in its own datatype (JSON or gRPC)."""
    if name not in signature.input_names:
        inputs = list(signature.input_names)
        raise InvalidInput(str(name), f"not an input of this model; inputs are {inputs}")
    if name in tensors:
        raise InvalidInput(name, "given more than once")
    want = signature.input(name)
    if datatype == "BYTES" and name in signature.images:
        return replace(want, datatype="BYTES", shape=want.shape[:1])  # one image a row
    if isinstance(datatype, str) and datatype in want.widens:  # JSON may send any value
        return replace(want, datatype=datatype)  # read as sent, widened once decoded
    if datatype != want.datatype:
        also = "".join(f" (or {d})" for d in sorted(want.widens))
        raise InvalidInput(
            name, f"datatype {datatype} does not match the model's {want.datatype}{also}"
        )
    return want
