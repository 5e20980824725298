"""Requested outputs reach the backend as the batch's union; admission by predicted wait."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ferry.batcher import (
    BatchLimits,
    DeadlineExceeded,
    MicroBatcher,
    PaddedBatch,
    QueueFull,
    SequenceLimits,
)
from tests.batcher.manual_clock import ManualClock
from tests.batcher.test_batcher import RecordingBackend, make, seq

pytestmark = pytest.mark.unit

LIMITS = SequenceLimits(max_length=64, vocab_size=1000)


async def test_a_batch_fetches_only_the_outputs_its_members_asked_for():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = make(backend, clock, dispatch_when_idle=False)
    futures = batcher.submit([seq(1, 2), seq(3)], outputs=frozenset({"total"}))
    rows = await clock.run_until_done(asyncio.gather(*futures))
    assert backend.batches[0].outputs == ("total",)
    assert [sorted(row) for row in rows] == [["total"], ["total"]]
    assert [float(row["total"][0]) for row in rows] == [3.0, 3.0]
    await batcher.close(1)


async def test_one_member_wanting_everything_fetches_everything():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = make(backend, clock, dispatch_when_idle=False)
    narrow = batcher.submit([seq(1, 2)], outputs=frozenset({"total"}))
    wide = batcher.submit([seq(3)])
    narrow_row, wide_row = await clock.run_until_done(asyncio.gather(*narrow, *wide))
    assert backend.batches[0].outputs is None
    assert "total" in narrow_row
    assert sorted(wide_row) == ["hidden", "total"]
    np.testing.assert_array_equal(wide_row["hidden"], [3.0])  # unpadded to its own length
    await batcher.close(1)


async def calibrated(backend_seconds_per_row: float) -> tuple[MicroBatcher, asyncio.Event]:
    gate = asyncio.Event()
    gate.set()

    async def timed(batch: PaddedBatch) -> dict[str, np.ndarray]:
        await asyncio.sleep(backend_seconds_per_row * batch.size)
        await gate.wait()
        return {"total": np.zeros((batch.size, 1), dtype=np.float32)}

    batcher = MicroBatcher("m", timed, BatchLimits(max_batch_size=8), LIMITS)
    await batcher.calibrate([(1, 4), (2, 4), (4, 4), (8, 4), (1, 8), (4, 8)])
    assert batcher.cost_model.ready
    gate.clear()  # from now on batches wait until the test lets them go
    batcher.start()
    return batcher, gate


async def test_a_request_that_the_queue_would_make_late_is_refused_at_once():
    batcher, gate = await calibrated(0.01)
    # 64 queued ahead: 8 batches of 8 at ~80 ms each, one at a time: ~0.6 s before a new one.
    ahead = [f for _ in range(64) for f in batcher.submit([seq(1, 2, 3, 4)])]
    wait = batcher.predicted_wait_s(1, 4)
    assert wait is not None and wait > 0.3
    with pytest.raises(QueueFull) as refused:
        batcher.submit([seq(1, 2, 3, 4)], timeout_s=0.05)
    assert refused.value.retry_after_s >= 1.0
    assert "deadline" in str(refused.value)
    (accepted,) = batcher.submit([seq(1, 2, 3, 4)], timeout_s=60)
    gate.set()
    await asyncio.gather(*ahead, accepted)
    await batcher.close(1)


async def test_an_empty_queue_admits_even_a_short_deadline():
    batcher, gate = await calibrated(0.01)
    # Admitted (no QueueFull): nothing ahead of it. Whether the 50 ms then hold is the wall
    # clock's on a loaded box, not admission's, so the answer may be a result or a deadline.
    (only,) = batcher.submit([seq(1, 2, 3, 4)], timeout_s=0.05)
    gate.set()
    (outcome,) = await asyncio.gather(only, return_exceptions=True)
    assert isinstance(outcome, dict | DeadlineExceeded), outcome
    await batcher.close(1)
