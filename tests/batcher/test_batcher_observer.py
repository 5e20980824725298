"""What the batcher reports (the observer behind the Prometheus series), how it learns batch
costs, and the Retry-After it derives from them. Clock time only: every figure is exact."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from ferry.batcher import (
    BatchAbandoned,
    BatchLimits,
    DeadlineExceeded,
    FormedBatch,
    MicroBatcher,
    PaddedBatch,
    QueueFull,
)
from ferry.batcher.cost_model import TERMS
from tests.batcher.manual_clock import ManualClock, settle
from tests.batcher.test_batcher import LIMITS, RecordingBackend, never_answering, seq

pytestmark = pytest.mark.unit


class RecordingObserver:
    def __init__(self) -> None:
        self.depths: list[int] = []
        self.rejections: list[str] = []
        self.formed: list[tuple] = []
        self.finished: list[tuple] = []
        self.cost_models: list[dict[str, float]] = []
        self.priorities: list[int] = []

    def queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def rejected(self, reason: str) -> None:
        self.rejections.append(reason)

    def batch_formed(self, batch: FormedBatch) -> None:
        self.formed.append(
            (batch.size, batch.real_tokens, batch.padded_tokens, batch.queue_waits_s, batch.rows)
        )
        self.priorities.append(batch.priority)

    def batch_finished(self, seconds, failed, predicted_s) -> None:
        self.finished.append((seconds, failed, predicted_s))

    def cost_model(self, coefficients: dict[str, float]) -> None:
        self.cost_models.append(coefficients)


def make(clock: ManualClock, backend: RecordingBackend, **limits) -> tuple:
    observer = RecordingObserver()
    batcher = MicroBatcher(
        "m",
        backend.infer,
        BatchLimits(**{"max_queue_delay_s": 0.01, **limits}),
        LIMITS,
        observer=observer,
        clock=clock,
    )
    return batcher, observer


async def test_batches_report_shape_waits_duration_and_prediction():
    clock = ManualClock()
    # In arrival order: a backend without a fixed cost saves nothing by batching, so the
    # fairness window of length grouping would hold only requests of one instant (collection.py).
    batcher, observer = make(
        clock,
        RecordingBackend(clock=clock),
        dispatch_when_idle=False,
        cost_model_batching=False,
        group_by_length=False,
    )
    await clock.run_until_done(batcher.calibrate(), step_s=0.05)
    batcher.start()
    futures = batcher.submit([seq(1, 2)])
    await clock.advance(0.004)
    futures += batcher.submit([seq(3)])
    await clock.run_until_done(asyncio.gather(*futures))
    size, real, padded, waits, rows = observer.formed[-1]
    assert (size, real, padded, rows) == (2, 3, 4, 2)
    assert waits == pytest.approx([0.01, 0.006])
    seconds, failed, predicted = observer.finished[-1]
    assert seconds == pytest.approx(0.004) and failed is False
    assert predicted == pytest.approx(0.004, abs=1e-4)  # 1 ms per padded token, learned
    assert observer.depths[-1] == 0 and max(observer.depths) == 2
    # Coefficients are published after a refit, not with every batch.
    assert len(observer.cost_models) == 1 and set(observer.cost_models[0]) == set(TERMS)
    await batcher.close(1)


async def test_only_successful_batches_teach_the_cost_model():
    clock = ManualClock()
    backend = RecordingBackend(clock=clock, poison=666)
    batcher, observer = make(clock, backend)
    await clock.run_until_done(batcher.calibrate(), step_s=0.05)
    batcher.start()
    (bad,) = batcher.submit([seq(666)])
    with pytest.raises(Exception, match="poisoned"):
        await clock.run_until_done(bad)
    assert observer.finished[-1][1] is True
    for i in range(8):  # the eighth successful batch triggers the next refit
        await clock.run_until_done(batcher.submit([seq(i + 1)])[0])
        assert len(observer.cost_models) == (1 if i < 7 else 2)


async def test_deadline_and_cancellation_are_reported_as_rejections():
    clock = ManualClock()
    batcher, observer = make(clock, RecordingBackend(asyncio.Event()), max_concurrent_batches=1)
    batcher.start()
    batcher.submit([seq(1)])
    await settle()
    (late,) = batcher.submit([seq(2)], timeout_s=0.5)
    (gone,) = batcher.submit([seq(3)])
    gone.cancel()
    await clock.advance(0.5)
    with pytest.raises(DeadlineExceeded, match="deadline passed"):
        late.result()
    assert observer.rejections == ["cancelled", "deadline"]
    await batcher.close(0)


async def test_retry_after_is_the_time_to_drain_the_queue_ahead():
    batcher = MicroBatcher(
        "m",
        RecordingBackend().infer,
        BatchLimits(max_batch_size=2, max_concurrent_batches=2, max_queue_size=120),
        LIMITS,
        clock=ManualClock(),
    )
    for i in range(120):  # not started: everything stays queued
        batcher.submit([seq(i + 1)])
    with pytest.raises(QueueFull) as info:
        batcher.submit([seq(1)])
    # 120 queued / 2 per batch / 2 batches at once * 50 ms (the initial batch estimate).
    assert info.value.retry_after_s == pytest.approx(1.5)
    await batcher.close(0)


async def test_retry_after_follows_the_measured_batch_time():
    clock = ManualClock()
    gate = asyncio.Event()
    calls = 0

    async def first_slow_then_stuck(batch: PaddedBatch) -> dict[str, np.ndarray]:
        nonlocal calls
        calls += 1
        await (clock.sleep(1.0) if calls == 1 else gate.wait())
        return {"total": np.zeros((batch.size, 1))}

    batcher = MicroBatcher(
        "m",
        first_slow_then_stuck,
        BatchLimits(max_batch_size=1, max_concurrent_batches=1, max_queue_size=60),
        LIMITS,
        clock=clock,
    )
    batcher.start()
    await clock.run_until_done(batcher.submit([seq(1)])[0])  # took 1 s
    batcher.submit([seq(2)])  # runs, and holds the only slot
    await settle()
    for i in range(50):
        batcher.submit([seq(i + 3)])
    with pytest.raises(QueueFull) as info:
        batcher.submit([seq(1)] * 11)
    # Recent batch time: 0.8 * 0.05 + 0.2 * 1.0 = 0.24 s; 50 batches ahead on one slot.
    assert info.value.retry_after_s == pytest.approx(12.0)
    await batcher.close(0)


async def test_default_calibration_shapes_cover_sizes_and_lengths_within_the_budget():
    clock = ManualClock()
    backend = RecordingBackend(clock=clock)
    batcher, _ = make(clock, backend, max_batch_size=8, max_batch_tokens=512)
    await clock.run_until_done(batcher.calibrate(), step_s=0.05)
    shapes = [(b.size, b.padded_length) for b in backend.batches]
    assert shapes == [(n, length) for n in (1, 2, 8) for length in (16, 32, 64)]
    for batch in backend.batches:
        assert batch.input_ids.dtype == np.int64 and (batch.input_ids == 1).all()
        assert batch.attention_mask.shape == batch.input_ids.shape
        assert (batch.attention_mask == 1).all()


@pytest.mark.parametrize(("shapes", "fits"), [(4, 1), (3, 0)])
async def test_calibration_refits_from_four_shapes(shapes, fits):
    clock = ManualClock()
    batcher, _ = make(clock, RecordingBackend(clock=clock))
    await clock.run_until_done(batcher.calibrate([(1, 8), (2, 8), (4, 16), (8, 16)][:shapes]))
    assert batcher.cost_model.fits == fits


async def test_failures_are_logged_with_the_model_and_the_error(caplog):
    caplog.set_level(logging.WARNING, logger="ferry.batcher")
    clock = ManualClock()
    batcher, _ = make(clock, RecordingBackend(poison=666), dispatch_when_idle=False)
    batcher.start()
    futures = batcher.submit([seq(1), seq(666)])
    await clock.run_until_done(asyncio.gather(*futures, return_exceptions=True))
    messages = [r.getMessage() for r in caplog.records]
    assert "model m: batch of 2 failed (poisoned input); retrying alone" in messages
    assert "model m: inference failed: poisoned input" in messages
    await batcher.close(1)


async def test_a_backend_cancelling_itself_is_not_reported_as_a_timeout():
    async def cancels_itself(batch: PaddedBatch) -> dict[str, np.ndarray]:
        raise asyncio.CancelledError

    clock = ManualClock()
    batcher = MicroBatcher(
        "m", cancels_itself, BatchLimits(), LIMITS, infer_timeout_s=10, clock=clock
    )
    batcher.start()
    (future,) = batcher.submit([seq(1)])
    await settle()
    assert isinstance(future.exception(), BatchAbandoned)
    await batcher.close(0)


async def test_a_stop_at_the_moment_of_the_timeout_is_a_stop_not_a_timeout():
    clock = ManualClock()
    batcher, future = never_answering(clock, infer_timeout_s=1.0)
    await settle()
    # Cancel the running batch in the same instant as its timeout fires.
    clock.call_at(clock.time() + 1.0, lambda: [t.cancel() for t in list(batcher.dispatch.running)])
    await clock.advance(1.0)
    assert isinstance(future.exception(), BatchAbandoned)
    await batcher.close(0)


async def test_refusals_at_submit_are_reported_with_their_reason():
    clock = ManualClock()
    batcher, observer = make(clock, RecordingBackend(), max_queue_size=1)
    batcher.submit([seq(1)])
    with pytest.raises(QueueFull):
        batcher.submit([seq(2)])
    await batcher.close(0)
    with pytest.raises(Exception, match="model 'm' is shutting down"):
        batcher.submit([seq(3)])
    assert observer.rejections == ["queue_full", "closed"]


async def test_each_batch_reports_the_priority_of_its_members():
    clock = ManualClock()
    batcher, observer = make(clock, RecordingBackend(clock=clock), max_concurrent_batches=1)
    futures = batcher.submit([seq(1)], priority=2) + batcher.submit([seq(2)], priority=-3)
    batcher.start()
    await clock.run_until_done(asyncio.gather(*futures))
    assert observer.priorities == [-3, 2]  # the urgent one first, each batch its own level
    await batcher.close(0)
