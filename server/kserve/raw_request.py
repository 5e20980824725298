"""Triton's raw binary request: a body that is nothing but one input's bytes, sent with
`Inference-Header-Content-Length: 0` (and no JSON header at all).

As Triton deduces it: the model must have one input; its shape is the model's, with a batch of
one where the model batches, and at most one variable axis, sized from the body's length; a
BYTES input takes the whole body as its one element, so the model's shape must be [1]. Every
output is answered as binary data. What cannot be deduced is a 400 in Triton's words.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from ferry.backends.tensor_signature import TensorSpec
from ferry.server.errors import MalformedRequest
from ferry.server.kserve.kserve_model import KServeModel

RAW_HEADER_LENGTH = "0"


def raw_request(model: KServeModel, body: bytes) -> tuple[dict[str, Any], bytes]:
    """The JSON header Triton deduces for `body`, and the body in the binary tensor form that
    header describes (a BYTES element length-prefixed)."""
    inputs = model.signature.inputs
    if len(inputs) != 1:
        raise MalformedRequest(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)} "
            f"inputs in '{model.name}' model configuration"
        )
    spec = inputs[0]
    batch = [1] if model.rows_first else []
    dims = spec.shape[len(batch) :]
    if spec.datatype == "BYTES":
        if list(dims) != [1]:
            raise MalformedRequest(
                f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
            )
        shape, body = [*batch, 1], struct.pack("<I", len(body)) + body
    else:
        shape = [*batch, *_deduced(spec, dims, len(body))]
    header = {
        "inputs": [
            {
                "name": spec.name,
                "datatype": spec.datatype,
                "shape": shape,
                "parameters": {"binary_data_size": len(body)},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    return header, body


def _deduced(spec: TensorSpec, dims: tuple[int | str, ...], size: int) -> list[int]:
    variable = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if len(variable) > 1:
        raise MalformedRequest(
            f"The shape of the raw input '{spec.name}' can not be deduced because there are "
            "more than one variable-sized dimension"
        )
    fixed = math.prod(d for d in dims if isinstance(d, int)) * spec.dtype.itemsize
    if not variable:
        return [int(d) for d in dims]  # the body's size is checked against it when decoded
    if fixed == 0 or size % fixed:
        raise MalformedRequest(
            f"the raw input '{spec.name}' of {size} bytes is not a whole number of "
            f"{spec.datatype} elements of shape {list(spec.metadata_shape())}"
        )
    return [size // fixed if i in variable else int(d) for i, d in enumerate(dims)]
