"""How long the batcher waits: under a latency objective the learned cost model sets the wait;
without one, the delay window does even when the model is ready; close waits for queued work."""

from __future__ import annotations

import asyncio

import pytest

from ferry.batcher import BatchLimits, MicroBatcher
from tests.batcher.manual_clock import ManualClock, settle
from tests.batcher.test_batcher import LIMITS, RecordingBackend, seq

pytestmark = pytest.mark.unit


async def calibrated(clock: ManualClock, backend: RecordingBackend, **limits) -> MicroBatcher:
    batcher = MicroBatcher("m", backend.infer, BatchLimits(**limits), LIMITS, clock=clock)
    # Three lengths: an exact fit. Long steps: the timers still fire at their own times.
    await clock.run_until_done(batcher.calibrate(), step_s=0.05)
    assert batcher.cost_model.ready
    backend.batches.clear()
    batcher.start()
    return batcher


async def test_the_objective_waits_while_a_full_batch_could_still_finish_in_half_of_it():
    clock = ManualClock()
    backend = RecordingBackend(clock=clock)  # 1 ms per padded token
    batcher = await calibrated(
        clock, backend, latency_objective_s=0.1, dispatch_when_idle=False, max_batch_size=32
    )
    (future,) = batcher.submit([seq(1)])
    # A full batch of 32 one-token requests costs ~32 ms: wait 50 - 32 = 18 ms for more.
    await clock.advance(0.0175)
    assert backend.batches == []
    await clock.advance(0.001)
    assert [b.size for b in backend.batches] == [1]
    await clock.run_until_done(future)
    await batcher.close(1)


async def test_without_an_objective_a_ready_cost_model_keeps_the_delay_window():
    clock = ManualClock()
    backend = RecordingBackend(clock=clock)
    batcher = await calibrated(clock, backend, max_queue_delay_s=0.01, dispatch_when_idle=False)
    (future,) = batcher.submit([seq(1)])
    await clock.advance(0.0095)
    assert backend.batches == []
    await clock.run_until_done(future)
    await batcher.close(1)


async def test_close_waits_for_work_still_queued_when_nothing_runs():
    batcher = MicroBatcher("m", RecordingBackend().infer, BatchLimits(), LIMITS)
    (queued,) = batcher.submit([seq(4)])  # not started yet: nothing running
    closing = asyncio.create_task(batcher.close(5))
    await settle()
    batcher.start()
    await asyncio.wait_for(closing, 5)
    assert queued.result()["total"].tolist() == [4.0]
