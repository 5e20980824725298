"""Request tensors checked against a graph's signature (server/tensor_inputs.py), alone."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ferry.backends.tensor_signature import Signature, TensorSpec
from ferry.server import tensor_inputs
from ferry.server.errors import InvalidInput
from ferry.server.tensor_inputs import (
    _typed_items,
    joined_numbers,
    json_tensor,
    nested,
    plain_numbers,
    records_tensors,
    typed_array,
    typed_tensor,
    valid_rows,
)

pytestmark = pytest.mark.unit

# One input per column, as skl2onnx converts a data frame's pipeline.
COLUMNS = Signature(
    (TensorSpec("age", "INT64", ("N", 1)), TensorSpec("income", "FP32", ("N", 1))),
    (TensorSpec("score", "FP32", ("N",)),),
)
MASKED = Signature(
    (TensorSpec("data", "FP32", ("N", "T")), TensorSpec("mask", "BOOL", ("N", "T"))),
    (TensorSpec("mean", "FP32", ("N",)),),
)


def test_records_of_scalars_fill_one_input_per_column():
    tensors = records_tensors(COLUMNS, [{"age": 30, "income": 1.5}, {"age": 41, "income": 2}])
    assert tensors["age"].dtype == np.int64 and tensors["age"].tolist() == [[30], [41]]
    assert tensors["income"].dtype == np.float32 and tensors["income"].shape == (2, 1)


@pytest.mark.parametrize(
    ("records", "field"),
    [
        ([{"age": 30}], "inputs[0].income"),
        ([{"age": 30, "income": 1, "city": 2}], "inputs[0].city"),
        ([{"age": 30.5, "income": 1}], "age[0]"),
        (["30,1"], "inputs[0]"),
    ],
)
def test_a_bad_record_is_refused_naming_it(records, field):
    with pytest.raises(InvalidInput) as error:
        records_tensors(COLUMNS, records)
    assert error.value.field == field


@pytest.mark.parametrize(
    ("datatype", "items", "field"),
    [
        ("BOOL", [True, 1], "x[1]"),
        ("UINT8", [255, 256], "x[1]"),
        ("UINT64", [2**64 - 1, -1], "x[1]"),
        ("INT64", [0, -(2**63), 2**63], "x[2]"),
        ("INT8", [-128, 127, -129], "x[2]"),
        ("INT32", [1, True], "x[1]"),
        ("FP32", [1.0, "2"], "x[1]"),
        ("FP16", [1.0, 1e6], "x[1]"),
    ],
)
def test_json_items_of_another_kind_or_out_of_range_are_refused(datatype, items, field):
    spec = TensorSpec("x", datatype, ("N",))
    with pytest.raises(InvalidInput) as error:
        typed_array("x", datatype, spec.dtype, items)
    assert error.value.field == field


@pytest.mark.parametrize("datatype", ["UINT64", "INT64", "INT8", "UINT8"])
def test_the_ends_of_each_integer_range_are_taken_exactly(datatype):
    spec = TensorSpec("x", datatype, ("N",))
    limits = np.iinfo(spec.dtype)
    ends = [int(limits.min), int(limits.max)]
    array = typed_array("x", datatype, spec.dtype, ends)
    assert array.dtype == spec.dtype and array.tolist() == ends


def test_named_axes_must_agree_between_inputs():
    data = json_tensor(MASKED.inputs[0], [[1.0, 2.0, 3.0]])
    rows = valid_rows(MASKED, {"data": data, "mask": np.ones((1, 3), np.bool_)}, True)
    assert rows.rows == 1 and rows.axis_sizes == {"T": 3}
    with pytest.raises(InvalidInput, match=r"axis 1 \(T\) is 2, but input 'data' has it 3"):
        valid_rows(MASKED, {"data": data, "mask": np.ones((1, 2), np.bool_)}, True)


@pytest.mark.parametrize("data", [[[1.0], [2.0, 3.0]], [1.0, [2.0]], [[1.0], 2.0]])
def test_ragged_nesting_is_refused_naming_the_input(data):
    with pytest.raises(InvalidInput) as error:
        json_tensor(MASKED.inputs[0], data)
    assert error.value.field == "data" and "rectangular" in error.value.message


# Long enough for the one-pass conversion (plain_numbers) rather than the short-list check, and
# nested, where the items numpy reads as 0 or 1 are looked up one by one.
LONG = [0.5] * 2000


@pytest.mark.parametrize(
    ("datatype", "data", "field"),
    [
        ("FP32", [*LONG, True], "x[2000]"),
        ("FP32", [*LONG, False, *LONG], "x[2000]"),
        ("FP32", [[0.5, 1.0], [True, 0.5]], "x[2]"),
        ("FP32", [[0.5] * 600, [False] + [0.5] * 599], "x[600]"),
        ("INT64", [1] * 2000 + [True], "x[2000]"),
        ("INT64", [[2, 3], [4, False]], "x[3]"),
        ("FP32", [*LONG, None], "x[2000]"),
        ("FP32", [*LONG, "1.5"], "x[2000]"),
        ("INT32", [*([7] * 2000), 1.0], "x[2000]"),
        ("FP16", [*LONG, 70000.0], "x[2000]"),
        ("INT8", [*([7] * 2000), 300], "x[2000]"),
        ("BOOL", [True] * 2000 + [1], "x[2000]"),
    ],
)
def test_long_and_nested_json_items_of_another_kind_are_refused(datatype, data, field):
    spec = TensorSpec("x", datatype, ("N",))
    with pytest.raises(InvalidInput) as error:
        typed_tensor("x", datatype, spec.dtype, data)
    assert error.value.field == field


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP32", [[0.0, 1.0, 0.25], [1.0, 0.0, -3.0]] * 400),
        ("FP16", [0.0, 1.0, 65504.0, -2.5] * 300),
        ("FP64", [1e300, 0, 1, -1e-300] * 300),
        ("INT64", [[0, 1, -(2**63), 2**63 - 1]] * 300),
        ("UINT8", [0, 1, 255, 7] * 300),
        ("BOOL", [[True, False]] * 600),
    ],
)
def test_long_and_nested_json_numbers_are_read_as_item_by_item(datatype, data):
    spec = TensorSpec("x", datatype, ("N",))
    shape, flat = nested("x", data)
    expected = _typed_items("x", datatype, spec.dtype, flat).reshape(shape)
    array = typed_tensor("x", datatype, spec.dtype, data)
    assert array.dtype == expected.dtype == spec.dtype
    assert array.shape == expected.shape and np.array_equal(array, expected)


def deep(levels: int) -> list:
    data: list = [1.0]
    for _ in range(levels - 1):
        data = [data]
    return data


@pytest.mark.parametrize("datatype", ["FP32", "BOOL", "BYTES"])
@pytest.mark.parametrize("levels", [33, 65, 900])  # numpy's own limit is 64
def test_lists_nested_past_the_axis_bound_are_refused_naming_the_input(datatype, levels):
    spec = TensorSpec("x", datatype, ("N",))
    with pytest.raises(InvalidInput, match="nested more than 32 deep") as error:
        typed_tensor("x", datatype, spec.dtype, deep(levels))
    assert error.value.field == "x"


def test_lists_nested_to_the_axis_bound_are_read():
    assert typed_tensor("x", "FP32", np.dtype(np.float32), deep(32)).shape == (1,) * 32


@pytest.mark.parametrize(
    "data",
    [
        ["a" * 10_000] + [""] * 5_000,
        [0.5, *[""] * 5_000, "a" * 10_000],  # a number first: no sample of the first item
        [[0.5] * 2, ["", "a" * 10_000]] * 2_500,
        [[0.5, 0.5], "a" * 10_000, *[[0.5, 0.5]] * 5_000],  # a string a level up
    ],
)
def test_strings_sent_for_numbers_are_refused_before_any_array_is_built(data):
    # numpy's inference would make them an items x longest-string array (200 MB here).
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput, match=r"must be numbers|rectangular"):
            typed_tensor("x", "FP32", np.dtype(np.float32), data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, peak


# Short lists take their own path (one pass over the items' types); its verdicts must be the
# general path's: the same array, or the same refusal naming the same item.
SHORT_LISTS = [
    [[1.5, 2, -3.25]],
    [1, 2, 3],
    [[0, 1], [1, 0]],
    [[True, 0.5]],
    [1, False],
    [[1e39]],
    [-70000.0, 3.0],
    [300, -129],
    [-1, 2],
    [2**63, 1],
    [2**64],
    [[1.0], [2.0, 3.0]],
    [[1.0, 2.0], 3.0],
    [[]],
    [[[1.0, 2.0]]],
    [[1.0, [2.0]]],
    [[None, 1.0]],
    [["1", 2]],
    [[{"a": 1}]],
    [1.0] * 512,
    [[0.5] * 16] * 32,
]


def outcome(datatype: str, data: object) -> tuple[object, ...]:
    dtype = TensorSpec("x", datatype, ("N",)).dtype
    try:
        array = typed_tensor("x", datatype, dtype, data)
    except InvalidInput as error:
        return ("refused", error.field, error.message)
    return ("read", array.dtype, array.shape, array.tolist())


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "INT8", "INT64", "UINT8", "UINT64"])
@pytest.mark.parametrize("data", SHORT_LISTS)
def test_short_lists_are_read_as_the_general_path_reads_them(monkeypatch, datatype, data):
    short = outcome(datatype, data)
    monkeypatch.setattr(tensor_inputs, "_small_flat", lambda _: None)
    assert short == outcome(datatype, data)


@pytest.mark.parametrize(
    ("datatype", "lists", "together"),
    [
        ("FP32", [[1.5, 2, -3e5], [0.25, 1, 0]], True),
        ("FP32", [[1.5, 2], [True, 1.0]], False),  # a boolean in one: each is read alone
        ("FP32", [[1.5, 2], [1e300, 1.0]], False),  # past FP32's range in one
        ("FP32", [[1.5, 2], [None, 1.0]], False),
        ("FP32", [[1.5, 2], [[1.0], 2.0]], False),  # nested in one
        ("INT8", [[1, 2], [127, -128]], True),
        ("INT8", [[1, 2], [128, 0]], False),
        ("INT64", [[1, 2], [2.5, 0]], False),  # a float for an integer type
        ("BOOL", [[True], [False]], False),  # not numbers
        ("FP32", [[1.0] * 600, [2.0]], False),  # a long list: read the long way
    ],
)
def test_joined_numbers_are_each_list_s_read_as_one(datatype, lists, together):
    dtype = TensorSpec("x", datatype, (-1,)).dtype
    joined = joined_numbers(datatype, dtype, lists)
    assert (joined is not None) == together
    if joined is not None:
        each = [plain_numbers(datatype, dtype, items) for items in lists]
        assert joined.dtype == dtype
        assert joined.tobytes() == np.concatenate(each).tobytes()
