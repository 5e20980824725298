"""The batcher's plain request objects: token sequences and the limits it asserts."""

from __future__ import annotations

import numpy as np
import pytest

from ferry.batcher import SequenceLimits, TokenSequence

pytestmark = pytest.mark.unit

LIMITS = SequenceLimits(max_length=4, vocab_size=10)


def test_from_ids_makes_int64_ids_and_a_full_mask():
    seq = TokenSequence.from_ids([1, 2, 3])
    assert seq.input_ids.dtype == np.int64 and seq.attention_mask.dtype == np.int64
    assert seq.attention_mask.tolist() == [1, 1, 1] and seq.length == 3
    masked = TokenSequence.from_ids([1, 2], [1, 0])
    assert masked.attention_mask.dtype == np.int64 and masked.attention_mask.tolist() == [1, 0]


def test_from_ids_makes_int64_of_narrower_integers_too():
    narrow = [np.int32(1), np.int32(0)]  # numpy would keep int32 unless told
    seq = TokenSequence.from_ids(narrow, narrow)
    assert seq.input_ids.dtype == np.int64 and seq.attention_mask.dtype == np.int64


def test_limits_admit_only_what_the_server_validated():
    """The server validates (tests/server/test_encoder_validation.py); the batcher asserts."""
    assert LIMITS.admits(TokenSequence.from_ids([0, 9, 0, 9], [1, 0, 0, 0]))
    assert LIMITS.admits(TokenSequence.from_ids([9]))
    assert not LIMITS.admits(TokenSequence.from_ids([]))
    assert not LIMITS.admits(TokenSequence.from_ids([1] * 5))
    assert not LIMITS.admits(TokenSequence.from_ids([1, 2], [1]))
    scalar_mask = TokenSequence(np.asarray([1, 2], dtype=np.int64), np.asarray(1, dtype=np.int64))
    assert not LIMITS.admits(scalar_mask)
    ids = np.asarray([1, 2], dtype=np.int64)
    segments = np.zeros(2, dtype=np.int64)
    assert LIMITS.admits(TokenSequence(ids, np.ones(2, dtype=np.int64), segments))
    assert not LIMITS.admits(TokenSequence(ids, np.ones(2, dtype=np.int64), segments[:1]))
