"""What a request must be before it is queued: each rule, its field and its message."""

from __future__ import annotations

import numpy as np
import pytest

from ferry.batcher import InvalidInput, SequenceLimits, TokenSequence

LIMITS = SequenceLimits(max_length=4, vocab_size=10)


def test_from_ids_makes_int64_ids_and_a_full_mask():
    seq = TokenSequence.from_ids([1, 2, 3])
    assert seq.input_ids.dtype == np.int64 and seq.attention_mask.dtype == np.int64
    assert seq.attention_mask.tolist() == [1, 1, 1] and seq.length == 3
    masked = TokenSequence.from_ids([1, 2], [1, 0])
    assert masked.attention_mask.dtype == np.int64 and masked.attention_mask.tolist() == [1, 0]


@pytest.mark.parametrize(
    ("ids", "mask", "field", "message"),
    [
        ([], None, "input_ids", "input_ids must be a non-empty list of token ids"),
        ([1] * 5, None, "input_ids", "sequence has 5 tokens; this model takes at most 4"),
        ([1, 2], [1], "attention_mask", "attention_mask has 1 values but input_ids has 2"),
        ([1, 10], None, "input_ids", "token id 10 is outside the vocabulary [0, 10)"),
        ([0, 10], None, "input_ids", "token id 10 is outside the vocabulary [0, 10)"),
        ([-1, 2], None, "input_ids", "token id -1 is outside the vocabulary [0, 10)"),
        ([1, 2], [1, 2], "attention_mask", "attention_mask values must be 0 or 1"),
        ([1, 2], [-1, 1], "attention_mask", "attention_mask values must be 0 or 1"),
        ([1, 2], [0, 0], "attention_mask", "attention_mask must keep at least one token"),
    ],
)
def test_each_rule_names_its_field_and_says_why(ids, mask, field, message):
    with pytest.raises(InvalidInput) as info:
        LIMITS.validate(TokenSequence.from_ids(ids, mask))
    assert (info.value.field, info.value.message, str(info.value)) == (field, message, message)


def test_a_scalar_mask_is_reported_as_zero_values():
    seq = TokenSequence(np.asarray([1, 2], dtype=np.int64), np.asarray(1, dtype=np.int64))
    with pytest.raises(InvalidInput, match="attention_mask has 0 values but input_ids has 2"):
        LIMITS.validate(seq)


def test_the_edges_of_every_range_are_accepted():
    LIMITS.validate(TokenSequence.from_ids([0, 9, 0, 9], [1, 0, 0, 0]))
    LIMITS.validate(TokenSequence.from_ids([9]))


@pytest.mark.parametrize(
    ("ids", "mask", "field", "message"),
    [
        (["x"], None, "input_ids", "token ids must be integers in [0, 2**63)"),
        ([2**64], None, "input_ids", "token ids must be integers in [0, 2**63)"),
        ([1], ["x"], "attention_mask", "attention_mask values must be 0 or 1"),
        ([1], [2**64], "attention_mask", "attention_mask values must be 0 or 1"),
    ],
)
def test_values_no_int64_holds_are_invalid_input_naming_the_field(ids, mask, field, message):
    with pytest.raises(InvalidInput) as info:
        TokenSequence.from_ids(ids, mask)
    assert (info.value.field, info.value.message) == (field, message)
