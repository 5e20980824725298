import numpy as np
import pytest

from ferry.batcher import InferenceFailed
from ferry.batcher.tensor_padding import TensorLayout, TensorRows, pad_tensors, split_outputs

pytestmark = pytest.mark.unit

LAYOUT = TensorLayout(
    inputs={"data": {1: "T"}, "mask": {1: "T"}, "scale": {}},
    outputs={"per_step": {1: "T"}},
    pad_values={"data": -1.0},
)


def member(length: int, rows: int = 1) -> TensorRows:
    data = np.arange(rows * length, dtype=np.float32).reshape(rows, length) + 1
    return TensorRows(
        {
            "data": data,
            "mask": np.ones((rows, length), dtype=np.int64),
            "scale": np.full((rows, 2), length, dtype=np.float32),
        },
        rows,
        {"T": length},
    )


def test_axes_of_one_name_pad_together_with_each_inputs_own_value():
    batch = pad_tensors([member(2), member(3, rows=2)], LAYOUT)
    assert batch.inputs["data"].shape == (3, 3)
    assert batch.inputs["data"][0].tolist() == [1, 2, -1]  # its pad value
    assert batch.inputs["mask"][0].tolist() == [1, 1, 0]  # the default, 0: the mask pads along
    assert batch.inputs["scale"].shape == (3, 2)  # no dynamic axis: stacked only
    assert batch.rows == (1, 2)
    assert batch.real_tokens == 2 + 2 + 2 + 6 + 6 + 4
    assert batch.padded_tokens == 9 + 9 + 6
    assert batch.size * batch.padded_length >= batch.padded_tokens


def test_members_of_one_size_stack_as_sent():
    batch = pad_tensors([member(3), member(3, rows=2)], LAYOUT)
    assert batch.inputs["data"].tolist() == [[1, 2, 3], [1, 2, 3], [4, 5, 6]]
    assert batch.inputs["data"].dtype == np.float32
    assert batch.inputs["mask"].dtype == np.int64
    assert batch.padded_tokens == batch.real_tokens


def test_outputs_are_cut_back_per_member_along_padded_axes_only():
    batch = pad_tensors([member(2), member(3, rows=2)], LAYOUT)
    values = {
        "per_step": np.arange(9).reshape(3, 3),
        "pooled": np.arange(6).reshape(3, 2),  # axis 1 is not named T: left whole
    }
    first, second = split_outputs(batch, values, LAYOUT)
    assert first["per_step"].tolist() == [[0, 1]]
    assert second["per_step"].tolist() == [[3, 4, 5], [6, 7, 8]]
    assert first["pooled"].tolist() == [[0, 1]]
    assert second["pooled"].shape == (2, 2)


def test_a_lone_member_is_its_own_batch():
    alone = member(4)
    batch = pad_tensors([alone], LAYOUT, outputs=("per_step",))
    assert batch.inputs["data"] is alone.tensors["data"]
    (row,) = split_outputs(batch, {"per_step": np.ones((1, 4)), "x": np.ones((1, 1))}, LAYOUT)
    assert set(row) == {"per_step"}  # only what was asked for


def test_an_output_of_the_wrong_row_count_fails_the_batch():
    batch = pad_tensors([member(2), member(2)], LAYOUT)
    with pytest.raises(InferenceFailed, match="'per_step' has 3 rows for a batch of 2"):
        split_outputs(batch, {"per_step": np.ones((3, 2))}, LAYOUT)
