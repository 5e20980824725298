"""Admission's arithmetic (batcher/admission.py), exactly, on a manual clock: the queue's
predicted drain from the recent completion rate, or from the cost model before there is one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ferry.batcher import BatchLimits, MicroBatcher, PaddedBatch, QueueFull, SequenceLimits
from tests.batcher.manual_clock import ManualClock, settle
from tests.batcher.test_batcher import seq
from tests.batcher.test_batcher_observer import RecordingObserver

LIMITS = SequenceLimits(max_length=64, vocab_size=1000)


class HeldBackend:
    """Each batch waits until the test releases it, so batches finish at chosen clock times."""

    def __init__(self) -> None:
        self.held: list[asyncio.Event] = []

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        release = asyncio.Event()
        self.held.append(release)
        await release.wait()
        return {"total": np.zeros((batch.size, 1), dtype=np.float32)}

    async def release_all(self) -> None:
        for event in self.held:
            event.set()
        self.held.clear()
        await settle()


def batcher_for(backend: HeldBackend, clock: ManualClock, **limits) -> MicroBatcher:
    return MicroBatcher("m", backend.infer, BatchLimits(**limits), LIMITS, clock=clock)


def exact_cost_model(batcher: MicroBatcher) -> None:
    """10 ms per batch plus 1 ms per padded token: predict(n, L) = 0.010 + 0.001 n L."""
    for n, length in [(1, 4), (2, 4), (4, 4), (1, 8), (2, 8), (4, 16), (8, 2)]:
        batcher.cost_model.observe(n, length, 0.010 + 0.001 * n * length)
    batcher.cost_model.refit()
    assert batcher.cost_model.predict(3, 3) == pytest.approx(0.019)


def queue(batcher: MicroBatcher, *lengths: int) -> None:
    for length in lengths:
        batcher.submit([seq(*range(1, length + 1))])


async def test_an_empty_queue_predicts_no_wait():
    batcher = batcher_for(HeldBackend(), ManualClock())
    exact_cost_model(batcher)
    assert batcher.predicted_wait_s() == 0.0


@pytest.mark.parametrize(
    ("lengths", "extra", "expected_s"),
    [
        # 7 requests of mean length 3: batches of 3 (9 tokens), 3 batches, 2 at a time: 2 rounds
        # of predict(3, 3) = 19 ms.
        ((1, 2, 3, 4, 5), (2, 6), 2 * 0.019),
        # Mean length 1 (two single tokens): one batch of 2.
        ((1, 1), (0, 0), 0.012),
        # Mean length 5: the token limit (9) allows one request per batch, 2 batches in 1 round.
        ((5, 5), (0, 0), 0.015),
    ],
)
async def test_before_any_completion_the_cost_model_predicts_rounds_of_full_batches(
    lengths, extra, expected_s
):
    batcher = batcher_for(
        HeldBackend(), ManualClock(), max_batch_size=4, max_batch_tokens=9, max_concurrent_batches=2
    )
    exact_cost_model(batcher)
    queue(batcher, *lengths)  # not started: everything stays queued
    assert batcher.predicted_wait_s(*extra) == pytest.approx(expected_s)


async def test_a_running_batch_adds_the_recent_batch_time():
    backend, clock = HeldBackend(), ManualClock()
    batcher = batcher_for(backend, clock, max_batch_size=4, max_concurrent_batches=1)
    exact_cost_model(batcher)
    batcher.start()
    queue(batcher, 1)
    await settle()
    assert batcher.running_batches == 1
    queue(batcher, 1, 1)
    # 50 ms (the initial recent batch time) for the one running, then one batch of 2.
    assert batcher.predicted_wait_s() == pytest.approx(0.05 + 0.012)
    await backend.release_all()
    await backend.release_all()
    await batcher.close(1)


async def test_under_load_the_recent_completion_rate_predicts_the_wait():
    backend, clock = HeldBackend(), ManualClock()
    batcher = batcher_for(backend, clock, max_batch_size=2, max_concurrent_batches=1)
    batcher.start()
    batcher.submit([seq(1), seq(2)])
    await settle()
    await backend.release_all()  # 2 done at t=1000.0
    # One completion gives no rate, and there is no cost model yet: nothing to go by.
    assert batcher.predicted_wait_s(2) is None
    await clock.advance(0.5)
    batcher.submit([seq(1), seq(2)])
    await settle()
    await backend.release_all()  # 2 more at t=1000.5
    # The first completion only opens the window: 2 requests in 0.5 s, 4 per second.
    assert batcher.predicted_wait_s(2) == pytest.approx(0.5)
    assert batcher.predicted_wait_s(6) == pytest.approx(1.5)
    await clock.advance(1.5)
    # Exactly the window (2 s) after the first completion it still counts: 2 in 2 s.
    assert batcher.predicted_wait_s(2) == pytest.approx(2.0)
    await clock.advance(0.25)
    # Past the window it is dropped: one completion left, no rate.
    assert batcher.predicted_wait_s(2) is None
    await batcher.close(1)


async def test_completions_all_at_one_instant_give_no_rate():
    backend, clock = HeldBackend(), ManualClock()
    batcher = batcher_for(backend, clock, max_batch_size=1, max_concurrent_batches=2)
    batcher.start()
    batcher.submit([seq(1), seq(2)])
    await settle()
    assert len(backend.held) == 2
    await backend.release_all()  # both at t=1000.0: no time has passed to measure a rate over
    assert batcher.predicted_wait_s(1) is None
    await batcher.close(1)


async def test_the_queued_tokens_follow_cancellations_and_dispatches():
    backend, clock = HeldBackend(), ManualClock()
    batcher = batcher_for(backend, clock, max_batch_size=4, max_concurrent_batches=1)
    exact_cost_model(batcher)
    queue(batcher, 5)
    (gone,) = batcher.submit([seq(1)])
    gone.cancel()
    await settle()
    # Only the 5-token request is left: one batch of one at length 5.
    assert batcher.predicted_wait_s() == pytest.approx(0.015)
    batcher.start()
    await settle()
    assert batcher.running_batches == 1 and batcher.queue_depth == 0
    queue(batcher, 1)
    # The dispatched request's tokens left with it: 50 ms running, then one of length 1.
    assert batcher.predicted_wait_s() == pytest.approx(0.05 + 0.011)
    await backend.release_all()
    await backend.release_all()
    await batcher.close(1)


def admission_batcher(observer=None) -> MicroBatcher:
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=9, max_concurrent_batches=2)
    batcher = MicroBatcher(
        "m", HeldBackend().infer, limits, LIMITS, clock=ManualClock(), observer=observer
    )
    exact_cost_model(batcher)
    queue(batcher, 1, 1)
    return batcher


async def test_admission_counts_the_new_requests_and_their_tokens_with_a_margin():
    observer = RecordingObserver()
    batcher = admission_batcher(observer)
    new = seq(1, 2, 3, 4, 5)
    # Three queued of mean length 2 in one batch: 16 ms, times the 1.5 margin: 24 ms.
    wait = batcher.predicted_wait_s(1, 5)
    assert wait == pytest.approx(0.016)
    with pytest.raises(QueueFull) as refused:
        batcher.submit([new], timeout_s=0.0225)
    assert refused.value.retry_after_s == 1.0  # at least a second
    assert str(refused.value) == "the queue ahead would take 0.0s, past this request's deadline"
    assert observer.rejections == ["predicted_late"]
    # Exactly at the margin is in time.
    (admitted,) = batcher.submit([new], timeout_s=wait * 1.5)
    assert not admitted.done()
    await batcher.close(0)
