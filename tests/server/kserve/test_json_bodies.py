"""server/kserve/json_bodies.py's worker function, called in-process: what it converts is what the
server's own conversion gives, and what it cannot convert it leaves for the server to name."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from ferry.backends.tensor_signature import TensorSpec
from ferry.server.kserve.json_bodies import parse
from ferry.server.tensor_inputs import typed_tensor

pytestmark = pytest.mark.unit


def body(*inputs: dict) -> bytes:
    return orjson.dumps({"inputs": list(inputs)})


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP32", [[0.5, -1.25], [3.0, 4]]),
        ("FP16", [1.5, 2.0]),
        ("INT64", [[1, -2], [3, 2**62]]),
        ("UINT8", [0, 255]),
        ("BOOL", [True, False]),
    ],
)
def test_numbers_become_the_array_the_server_would_make(datatype, data):
    (spec,) = parse(body({"name": "x", "datatype": datatype, "data": data}))["inputs"]
    expected = typed_tensor("x", datatype, TensorSpec("x", datatype, ()).dtype, data)
    assert spec["data"].dtype == expected.dtype
    np.testing.assert_array_equal(spec["data"], expected)


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP32", [1.0, True]),  # a boolean among numbers: the server names the item
        ("INT64", [1, 1.5]),
        ("INT8", [1, 300]),  # past the datatype's range
        ("FP32", [[1.0], [2.0, 3.0]]),  # ragged
        ("BYTES", ["a", "b"]),
        ("BF16", [1.0, 2.0]),  # binary only
    ],
)
def test_what_does_not_convert_stays_json(datatype, data):
    (spec,) = parse(body({"name": "x", "datatype": datatype, "data": data}))["inputs"]
    assert spec["data"] == data


@pytest.mark.parametrize("raw", [b"{", b"[]", b'{"inputs": {}}', b'{"id": "x"}', b"\xff"])
def test_a_body_the_server_must_refuse_comes_back_as_none(raw):
    assert parse(raw) is None
