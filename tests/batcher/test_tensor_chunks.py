"""Splitting a request of more rows than a batch takes, and joining its answers."""

from __future__ import annotations

import numpy as np
import pytest

from ferry.batcher import BatchLimits, TensorRows
from ferry.batcher.tensor_chunks import chunk_rows, join_rows, split_rows

pytestmark = pytest.mark.unit


def request(rows: int, width: int = 5) -> TensorRows:
    data = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    mask = np.ones((rows, width), dtype=np.int64)
    return TensorRows({"data": data, "mask": mask}, rows, {"T": width}, (("S", 2),))


@pytest.mark.parametrize(
    ("limits", "rows"),
    [
        (BatchLimits(max_batch_size=3), 3),
        # 10 elements a row (two inputs of 5): 25 elements take 2 rows.
        (BatchLimits(max_batch_size=3, max_batch_tokens=25), 2),
        (BatchLimits(max_batch_size=3, max_batch_tokens=4), 1),  # a row over: alone
    ],
)
def test_a_chunk_holds_what_one_batch_takes(limits, rows):
    assert chunk_rows(request(7), limits) == rows


def test_chunks_keep_the_request_s_axes_and_join_back_in_order():
    whole = request(7)
    chunks = split_rows(whole, 3)
    assert [c.rows for c in chunks] == [3, 3, 1]
    assert all(c.axis_sizes == whole.axis_sizes and c.shape_key == whole.shape_key for c in chunks)
    joined = join_rows([dict(c.tensors) for c in chunks])
    for name, value in whole.tensors.items():
        np.testing.assert_array_equal(joined[name], value)
    assert split_rows(whole, 7) == [whole]
