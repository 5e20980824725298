"""server/json_bodies.py's worker function, called in-process: what it converts is what the
server's own conversion gives, and what it cannot convert it leaves for the server to name."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from ferry.backends.tensor_signature import TensorSpec
from ferry.server.json_bodies import parse, parse_predict
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


DATATYPES = {"gb": {"X": "FP32", "ids": "INT64"}, "": {"X": "FP32", "ids": "INT64"}}


@pytest.mark.parametrize("model", ["gb", None])  # None: the default model's datatypes
def test_predict_inputs_become_arrays_of_the_graphs_datatypes(model):
    raw = {"inputs": {"X": [[1, 2.5]], "ids": [[1, True]], "other": [1.0]}}
    if model is not None:
        raw["model"] = model
    inputs = parse_predict(orjson.dumps(raw), DATATYPES)["inputs"]
    np.testing.assert_array_equal(inputs["X"], np.array([[1, 2.5]], np.float32))
    assert inputs["X"].dtype == np.float32
    assert inputs["ids"] == [[1, True]]  # a boolean among integers: the server names it
    assert inputs["other"] == [1.0]  # not an input: the server says so


def test_predict_bodies_for_other_models_or_as_records_stay_json():
    for raw in (
        {"model": "an-encoder", "inputs": {"X": [1.0]}},
        {"model": "gb", "inputs": [{"X": 1.0}]},
    ):
        assert parse_predict(orjson.dumps(raw), DATATYPES) == raw
    for broken in (b"{", b"[]", b'{"model": 3}'):
        assert parse_predict(broken, DATATYPES) is None
