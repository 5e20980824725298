"""MicroBatcher.calibrate's default warm-up shapes: sizes and lengths that span the model's
limits, never a batch over the padded-token budget."""

from __future__ import annotations

import pytest

from ferry.batcher import BatchLimits, MicroBatcher, SequenceLimits
from tests.batcher.test_batcher import RecordingBackend

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("max_batch_size", "max_batch_tokens", "max_length", "shapes"),
    [
        # Sizes 1, a quarter and the full batch; lengths 16, 64 and half the longest.
        (4, 2048, 100, [(1, 16), (1, 50), (1, 64), (4, 16), (4, 50), (4, 64)]),
        # The token budget drops the shapes over it (8 x 16 = 128 > 64).
        (8, 64, 64, [(1, 16), (1, 32), (1, 64), (2, 16), (2, 32)]),
        # A one-token model still gets a shape.
        (1, 2048, 1, [(1, 1)]),
    ],
)
async def test_default_shapes_span_the_limits(max_batch_size, max_batch_tokens, max_length, shapes):
    backend = RecordingBackend()
    limits = BatchLimits(max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens)
    batcher = MicroBatcher(
        "m", backend.infer, limits, SequenceLimits(max_length=max_length, vocab_size=1000)
    )
    await batcher.calibrate()
    assert [(b.size, b.padded_length) for b in backend.batches] == shapes
