import numpy as np
import pytest

from ferry.batcher.padding import pad_batch, stack_rows, unpad_outputs
from ferry.batcher.request import TokenSequence

pytestmark = pytest.mark.unit


def test_batch_is_padded_to_its_own_longest_sequence():
    batch = pad_batch(
        [TokenSequence.from_ids([5, 6, 7]), TokenSequence.from_ids([8])], pad_token_id=0
    )
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.lengths == (3, 1)
    assert (batch.padded_tokens, batch.real_tokens) == (6, 4)


def test_a_batch_of_one_is_its_row_with_its_own_mask_in_writable_arrays():
    # Read-only, as rows off the engine's wire are; int32, as a KServe INT32 tensor's may be.
    ids, mask = np.array([5, 6, 7], np.int32), np.array([1, 1, 0], np.int32)
    ids.flags.writeable = mask.flags.writeable = False
    batch = pad_batch([TokenSequence(ids, mask)], pad_token_id=9, outputs=("pooled",))
    assert batch.input_ids.tolist() == [[5, 6, 7]] and batch.attention_mask.tolist() == [[1, 1, 0]]
    for array in (batch.input_ids, batch.attention_mask):
        assert array.dtype == np.int64 and array.flags.c_contiguous and array.flags.writeable
    assert (batch.lengths, batch.outputs, batch.padded_tokens) == ((3,), ("pooled",), 3)


def test_pad_token_is_configurable_and_masks_are_kept():
    batch = pad_batch([TokenSequence.from_ids([1, 2], [1, 0]), TokenSequence.from_ids([3])], 9)
    assert batch.input_ids.tolist() == [[1, 2], [3, 9]]
    assert batch.attention_mask.tolist() == [[1, 0], [1, 0]]


def test_unpad_cuts_sequence_outputs_to_each_length_and_keeps_pooled_rows():
    outputs = {
        "last_hidden_state": np.arange(2 * 3 * 2).reshape(2, 3, 2),
        "sentence_embedding": np.array([[1.0, 2.0], [3.0, 4.0]]),
    }
    rows = unpad_outputs(outputs, [3, 1], frozenset({"last_hidden_state"}))
    assert rows[0]["last_hidden_state"].shape == (3, 2)
    assert rows[1]["last_hidden_state"].shape == (1, 2)
    assert rows[1]["last_hidden_state"].tolist() == [[6, 7]]
    assert rows[1]["sentence_embedding"].tolist() == [3.0, 4.0]


def test_default_pad_token_is_zero_and_both_arrays_are_int64():
    batch = pad_batch([TokenSequence.from_ids([5, 6]), TokenSequence.from_ids([7])])
    assert batch.input_ids.tolist() == [[5, 6], [7, 0]]
    assert batch.input_ids.dtype == np.int64 and batch.attention_mask.dtype == np.int64


def test_unwanted_outputs_are_skipped_not_the_end_of_the_split():
    outputs = {
        "extra": np.zeros((2, 1), dtype=np.float32),
        "total": np.array([[1.0], [2.0]], dtype=np.float32),
    }
    rows = unpad_outputs(outputs, [1, 1], frozenset(), ("total",))
    assert [row["total"].tolist() for row in rows] == [[1.0], [2.0]]
    assert all(set(row) == {"total"} for row in rows)


def test_stack_rows_pads_sequence_rows_back_to_the_width():
    parts = [np.ones((2, 3)), np.ones((4, 3))]
    stacked = stack_rows(parts, 5)
    assert stacked.shape == (2, 5, 3)
    assert stacked[0, 2:].sum() == 0 and stacked[1, :4].all() and stacked[1, 4:].sum() == 0
    pooled = stack_rows([np.full(3, 1.0), np.full(3, 2.0)])
    assert pooled.tolist() == [[1.0] * 3, [2.0] * 3]


def test_segment_ids_pad_with_zeros_and_stay_none_when_nobody_sent_any():
    pair = TokenSequence(np.array([5, 6, 7]), np.ones(3, np.int64), np.array([0, 1, 1]))
    batch = pad_batch([TokenSequence.from_ids([8]), pair])
    assert batch.token_type_ids is not None
    assert batch.token_type_ids.tolist() == [[0, 0, 0], [0, 1, 1]]
    assert pad_batch([pair]).token_type_ids.tolist() == [[0, 1, 1]]
    # A lone member's segment ids of a narrower type (a KServe INT32 tensor) come out int64.
    narrow = TokenSequence(np.array([5, 6]), np.ones(2, np.int64), np.array([0, 1], np.int32))
    lone = pad_batch([narrow]).token_type_ids
    assert lone is not None and lone.dtype == np.int64
    assert (
        pad_batch([TokenSequence.from_ids([8]), TokenSequence.from_ids([9])]).token_type_ids is None
    )
