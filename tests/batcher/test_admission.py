"""Admission's arithmetic (batcher/admission.py), exactly, on a manual clock: each queued
request's share of the cheapest batch at its length, summed over the work served before or beside a
new request (its priority and more urgent ones), over the concurrent batch slots."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ferry.batcher import BatchLimits, MicroBatcher, PaddedBatch, QueueFull, SequenceLimits
from ferry.batcher.admission import ADMISSION_SHARE, request_places
from ferry.batcher.policy import most_at
from tests.batcher.manual_clock import ManualClock, settle
from tests.batcher.test_batcher import seq
from tests.batcher.test_batcher_observer import RecordingObserver

pytestmark = pytest.mark.unit

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


def queue(batcher: MicroBatcher, *lengths: int, priority: int = 0) -> list[asyncio.Future]:
    return [
        f
        for length in lengths
        for f in batcher.submit([seq(*range(1, length + 1))], priority=priority)
    ]


async def one_running_batch_of_four() -> tuple[HeldBackend, MicroBatcher]:
    """One slot, batches of at most 4, the exact cost model, and one batch held running."""
    backend = HeldBackend()
    batcher = batcher_for(backend, ManualClock(), max_batch_size=4, max_concurrent_batches=1)
    exact_cost_model(batcher)
    batcher.start()
    queue(batcher, 1)
    await settle()
    assert batcher.running_batches == 1
    return backend, batcher


async def test_an_empty_queue_predicts_no_wait():
    batcher = batcher_for(HeldBackend(), ManualClock())
    exact_cost_model(batcher)
    assert batcher.predicted_wait_s() == 0.0


def small_batches() -> MicroBatcher:
    """Batches of at most 4 requests or 9 padded tokens, 2 at a time."""
    batcher = batcher_for(
        HeldBackend(), ManualClock(), max_batch_size=4, max_batch_tokens=9, max_concurrent_batches=2
    )
    exact_cost_model(batcher)
    return batcher


@pytest.mark.parametrize(
    ("length", "share_s"),
    [
        (2, (0.010 + 0.008) / 4),  # 4 fit the size limit
        (3, (0.010 + 0.009) / 3),  # 3 fit the 9-token limit
        (5, 0.015),  # one per batch
        (20, 0.030),  # over the token limit: it still runs, alone
    ],
)
async def test_a_request_costs_its_share_of_the_cheapest_batch_at_its_length(length, share_s):
    assert small_batches().request_cost_s(length) == pytest.approx(share_s)


async def test_a_price_kept_for_its_length_follows_every_refit():
    # Prices are kept by length between fits (admission prices every request): a refit,
    # through the batcher's own or by hand, must not leave the old price.
    batcher = small_batches()
    assert batcher.request_cost_s(5) == pytest.approx(0.015)
    for n, length in [(1, 4), (2, 4), (4, 4), (1, 8), (2, 8), (4, 16), (8, 2)]:
        batcher.cost_model.observe(n, length, 2 * (0.010 + 0.001 * n * length))
    batcher.cost_model.refit()
    fresh = batcher.cost_model.best_share(5, most_at(batcher.limits, 5))[1]
    assert fresh > 0.015 and batcher.request_cost_s(5) == fresh


async def test_before_the_cost_model_is_ready_nothing_is_predicted_and_all_is_admitted():
    batcher = batcher_for(HeldBackend(), ManualClock())
    assert batcher.request_cost_s(4) == 0.0
    queue(batcher, 4, 4)
    assert batcher.predicted_wait_s() is None
    (admitted,) = batcher.submit([seq(1)], timeout_s=1e-6)
    assert not admitted.done()
    await batcher.close(0)


async def test_the_wait_counts_the_work_of_its_priority_and_more_urgent_ones_only():
    batcher = small_batches()
    queue(batcher, 2, 2, priority=0)
    queue(batcher, 5, priority=-1)
    queue(batcher, 3, priority=1)
    share = {2: 0.0045, 3: 0.019 / 3, 5: 0.015}
    # Over 2 concurrent slots; nothing running yet.
    assert batcher.predicted_wait_s(-2) == 0.0
    assert batcher.predicted_wait_s(-1) == pytest.approx(share[5] / 2)
    assert batcher.predicted_wait_s(0) == pytest.approx((share[5] + 2 * share[2]) / 2)
    assert batcher.predicted_wait_s() == batcher.predicted_wait_s(0)  # the default priority
    assert batcher.predicted_wait_s(0, 0.01) == pytest.approx((share[5] + 2 * share[2] + 0.01) / 2)
    assert batcher.predicted_wait_s(1) == pytest.approx((share[5] + 2 * share[2] + share[3]) / 2)
    await batcher.close(0)


async def test_a_running_batch_adds_the_recent_batch_time():
    backend, batcher = await one_running_batch_of_four()
    queue(batcher, 1, 1)
    # 50 ms (the initial recent batch time) for the one running, then two shares of a batch of 4.
    assert batcher.predicted_wait_s() == pytest.approx(0.05 + 2 * 0.014 / 4)
    await backend.release_all()
    await backend.release_all()
    await batcher.close(1)


async def test_the_queued_work_follows_cancellations_and_dispatches():
    backend, clock = HeldBackend(), ManualClock()
    batcher = batcher_for(backend, clock, max_batch_size=4, max_concurrent_batches=1)
    exact_cost_model(batcher)
    queue(batcher, 5)
    (gone,) = queue(batcher, 1, priority=3)
    (also_gone,) = queue(batcher, 3)
    gone.cancel()
    also_gone.cancel()
    await settle()
    # Only the 5-token request is left, and priority 3 has no queue any more.
    assert batcher.queue.work_by_priority == {0: pytest.approx(0.030 / 4)}
    assert batcher.queue.count_by_priority == {0: 1}
    batcher.start()
    await settle()
    assert batcher.running_batches == 1 and batcher.queue_depth == 0
    assert batcher.queue.work_by_priority == {} and batcher.queue.count_by_priority == {}
    queue(batcher, 1, 1)
    assert batcher.queue.work_by_priority == {0: pytest.approx(2 * 0.014 / 4)}
    await backend.release_all()
    await backend.release_all()
    await batcher.close(1)


async def test_a_refit_prices_the_queued_requests_again():
    from tests.batcher.test_collection import CostedBackend  # it imports this module

    clock = ManualClock()
    limits = BatchLimits(max_batch_size=1, max_concurrent_batches=1)
    backend = CostedBackend(clock)  # 10 ms + 1 ms per padded token, as the exact model says
    batcher = MicroBatcher("m", backend.infer, limits, LIMITS, clock=clock)
    # Seven observations: one short of the first refit, so the model is not ready yet.
    for n, length in [(1, 4), (2, 4), (4, 4), (1, 8), (2, 8), (4, 16), (8, 2)]:
        batcher.cost_model.observe(n, length, 0.010 + 0.001 * n * length)
    assert not batcher.cost_model.ready
    futures = queue(batcher, 4, 4, 4) + queue(batcher, 2, priority=1)
    assert batcher.queue.work_by_priority == {0: 0.0, 1: 0.0}  # priced before it was ready
    batcher.start()
    # The first batch (4 tokens, 14 ms) is the eighth observation: the refit prices what is
    # queued: one 4-token request left at priority 0 (the second batch has just started), one
    # 2-token request at priority 1, each alone in a batch of one.
    await clock.advance(0.014)
    assert batcher.cost_model.ready and batcher.queue_depth == 2
    assert batcher.queue.work_by_priority == {0: pytest.approx(0.014), 1: pytest.approx(0.012)}
    await clock.run_until_done(asyncio.gather(*futures))
    await batcher.close(0)


def admission_batcher(observer=None) -> MicroBatcher:
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=9, max_concurrent_batches=2)
    batcher = MicroBatcher(
        "m", HeldBackend().infer, limits, LIMITS, clock=ManualClock(), observer=observer
    )
    exact_cost_model(batcher)
    queue(batcher, 1, 1)
    queue(batcher, 5, 5, 5, 5, priority=1)  # less urgent: never ahead of priority 0
    return batcher


async def test_admission_refuses_what_would_finish_past_its_share_of_the_time_left():
    observer = RecordingObserver()
    batcher = admission_batcher(observer)
    new = seq(1, 2, 3, 4, 5)
    # Two of one token (a share of 11 ms each... of 14 ms / 4) and the new one (15 ms), over 2.
    wait = (2 * 0.014 / 4 + 0.015) / 2
    assert batcher.predicted_wait_s(0, batcher.request_cost_s(5)) == pytest.approx(wait)
    with pytest.raises(QueueFull) as refused:
        batcher.submit([new], timeout_s=wait / ADMISSION_SHARE * 0.999)
    assert refused.value.retry_after_s == 1.0  # at least a second
    assert str(refused.value) == "the queue ahead would take 0.0s, past this request's deadline"
    assert observer.rejections == ["predicted_late"]
    (admitted,) = batcher.submit([new], timeout_s=wait / ADMISSION_SHARE * 1.001)
    assert not admitted.done()
    await batcher.close(0)


async def test_a_late_request_is_told_to_retry_when_the_queue_would_let_it_finish():
    batcher = small_batches()
    queue(batcher, *[5] * 400)  # 400 x 15 ms over 2 slots: 3 s
    wait = batcher.predicted_wait_s(0, 0.015)
    assert wait == pytest.approx(3.0075)
    with pytest.raises(QueueFull) as refused:
        batcher.submit([seq(1, 2, 3, 4, 5)], timeout_s=1.0)
    assert refused.value.retry_after_s == pytest.approx(wait - 1.0)
    await batcher.close(0)


async def test_less_urgent_work_queued_ahead_does_not_refuse_an_urgent_request():
    batcher = admission_batcher()
    ahead = queue(batcher, 5, 5, 5, 5, 5, 5, priority=1)
    # At priority 1 ten 5-token requests (150 ms) are ahead: (7 + 150 + 15 ms) / 2 = 86 ms, over
    # 85 % of 80 ms; at priority 0 only two 1-token ones: (7 + 15 ms) / 2 = 11 ms.
    with pytest.raises(QueueFull):
        batcher.submit([seq(1, 2, 3, 4, 5)], timeout_s=0.08, priority=1)
    (urgent,) = batcher.submit([seq(1, 2, 3, 4, 5)], timeout_s=0.08, priority=0)
    assert not urgent.done()
    await batcher.close(0)
    await asyncio.gather(*ahead, return_exceptions=True)


async def test_a_newcomer_that_would_make_a_queued_less_urgent_request_late_is_refused():
    observer = RecordingObserver()
    clock = ManualClock()
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=9, max_concurrent_batches=2)
    batcher = MicroBatcher("m", HeldBackend().infer, limits, LIMITS, clock=clock, observer=observer)
    exact_cost_model(batcher)
    five = seq(1, 2, 3, 4, 5)  # 15 ms each: one per batch
    (early,) = batcher.submit([seq(1)], priority=0)  # 3.5 ms, queued first, served first
    # Admitted at priority 1 with 22 ms: it would finish at (3.5 + 15) / 2 = 9.25 ms, within
    # 85 % of 22 ms (18.7 ms).
    (promised,) = batcher.submit([five], timeout_s=0.022, priority=1)
    # An urgent 5-token request moves it to 16.75 ms: still within 18.7 ms.
    (first,) = batcher.submit([five], priority=0)
    # A 3-token one (19 ms / 3 of work) would move it to 19.92 ms: refused, though it would
    # itself be on time.
    with pytest.raises(QueueFull) as refused:
        batcher.submit([seq(1, 2, 3)], priority=0)
    assert str(refused.value) == "it would make less urgent queued requests miss their deadlines"
    assert refused.value.retry_after_s == 1.0  # the whole queue drains in 17 ms: at least 1 s
    assert observer.rejections == ["predicted_late"]
    # A 1-token one (3.5 ms of work) moves it to 18.5 ms only: admitted.
    (small,) = batcher.submit([seq(1)], priority=0)
    # Of the same priority, a newcomer is served after it: admitted.
    (same,) = batcher.submit([five], priority=1)
    assert not any(f.done() for f in (early, promised, first, small, same))
    await batcher.close(0)


async def test_queued_requests_without_a_deadline_are_passed_over_for_those_with_one():
    batcher = batcher_for(HeldBackend(), ManualClock(), max_batch_size=4, max_batch_tokens=9)
    exact_cost_model(batcher)
    (free,) = batcher.submit([seq(1)], priority=1)
    # (3.5 + 15) / 2 = 9.25 ms, within 85 % of 12 ms; an urgent 5-token one adds 7.5 ms.
    (promised,) = batcher.submit([seq(1, 2, 3, 4, 5)], timeout_s=0.012, priority=1)
    with pytest.raises(QueueFull):
        batcher.submit([seq(1, 2, 3, 4, 5)], priority=0)
    assert not free.done() and not promised.done()
    await batcher.close(0)


async def test_the_running_batch_counts_before_a_queued_request_s_finish():
    backend, batcher = await one_running_batch_of_four()
    five = seq(1, 2, 3, 4, 5)  # 10 + 4 * 5 ms for a batch of 4: 7.5 ms each, on one slot
    # 50 ms (the recent batch time) running, then its own 7.5 ms: within 85 % of 70 ms.
    (promised,) = batcher.submit([five], timeout_s=0.070, priority=1)
    # An urgent one makes it 65 ms, past 59.5 ms (without the running batch it would be 15).
    with pytest.raises(QueueFull):
        batcher.submit([five], priority=0)
    await backend.release_all()
    await batcher.close(0)
    assert promised.done()


async def test_a_queued_request_already_predicted_late_refuses_no_newcomer():
    clock = ManualClock()
    batcher = batcher_for(HeldBackend(), clock, max_batch_size=4, max_batch_tokens=9)
    exact_cost_model(batcher)
    (late,) = batcher.submit([seq(1, 2, 3, 4, 5)], timeout_s=0.020, priority=1)
    (no_deadline,) = batcher.submit([seq(1)], priority=1)  # nothing to keep
    # 15 ms later 85 % of the 5 ms left is 4.25 ms: it finishes at 7.5 ms whatever comes.
    await clock.advance(0.015)
    (urgent,) = batcher.submit([seq(1, 2, 3, 4, 5)], priority=0)
    assert not any(f.done() for f in (late, no_deadline, urgent))
    await batcher.close(0)


async def test_retry_after_is_the_whole_queue_s_predicted_drain_when_it_is_full():
    backend, clock = HeldBackend(), ManualClock()
    batcher = batcher_for(backend, clock, max_queue_size=60, max_concurrent_batches=1)
    exact_cost_model(batcher)
    queue(batcher, *[60] * 40, priority=5)
    queue(batcher, *[60] * 20, priority=-5)
    with pytest.raises(QueueFull) as refused:
        batcher.submit([seq(1)], priority=-9)
    # 60 requests of 60 tokens, 34 per batch of 2048 tokens: 60 shares of predict(34, 60) / 34.
    expected = 60 * (0.010 + 0.001 * 34 * 60) / 34
    assert refused.value.retry_after_s == pytest.approx(expected, rel=1e-3)
    await batcher.close(0)


async def test_more_items_than_the_whole_queue_holds_are_refused_at_once_even_when_it_is_empty():
    # All or none: the server refuses such a request as invalid before it gets here.
    batcher = batcher_for(HeldBackend(), ManualClock(), max_queue_size=2)
    exact_cost_model(batcher)
    with pytest.raises(QueueFull) as refused:
        batcher.submit([seq(1)] * 3)
    assert refused.value.retry_after_s == 1.0
    assert len(batcher.queue) == 0
    await batcher.close(0)


async def test_retry_after_before_the_cost_model_counts_batches_of_the_recent_batch_time():
    batcher = batcher_for(HeldBackend(), ManualClock(), max_queue_size=100, max_batch_size=2)
    queue(batcher, *[3] * 100)
    with pytest.raises(QueueFull) as refused:
        batcher.submit([seq(1)])
    # 50 batches ahead over 2 slots at 50 ms each.
    assert refused.value.retry_after_s == pytest.approx(25 * 0.05)
    await batcher.close(0)


class TwiceAsSlowBackend:
    """Each batch takes twice what the exact cost model says, in the clock's time."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        await self.clock.sleep(2 * (0.010 + 0.001 * batch.size * batch.padded_length))
        return {"total": np.zeros((batch.size, 1), dtype=np.float32)}


async def test_the_prediction_follows_how_long_batches_really_took_per_priced_second():
    clock = ManualClock()
    batcher = batcher_for(TwiceAsSlowBackend(clock), clock, max_concurrent_batches=1)
    exact_cost_model(batcher)
    batcher.cost_model._refit_every = 10**9  # the model stays as it is; only the pace learns
    own = batcher.request_cost_s(4)
    assert batcher.predicted_wait_s(0, own) == pytest.approx(own)
    batcher.start()
    prior_s = batcher.dispatch.recent_batch_s  # pace 1 before, worth a batch of this time
    took = 2 * (0.010 + 0.004)  # priced at one share (`own`), twice the model's batch of one
    (first,) = queue(batcher, 4)
    await clock.run_until_done(first)
    # Moving sums of seconds taken and priced, the prior their start: their ratio is the pace.
    took_s, priced_s = 0.8 * prior_s + 0.2 * took, 0.8 * prior_s + 0.2 * own
    assert batcher.predicted_wait_s(0, own) == pytest.approx(own * took_s / priced_s)
    # The second batch moves the sums on from there, not from the prior.
    (second,) = queue(batcher, 4)
    await clock.run_until_done(second)
    took_s, priced_s = 0.8 * took_s + 0.2 * took, 0.8 * priced_s + 0.2 * own
    pace = took_s / priced_s
    assert pace > 1  # on its way to 2 * (0.010 + 0.004) / own, from the prior's 1
    assert batcher.predicted_wait_s(0, own) == pytest.approx(own * pace)
    # Behind one queued request: a deadline the model alone would meet (2 * own, at 85 %), the
    # learned pace would not: refused at once.
    queue(batcher, 4)
    with pytest.raises(QueueFull):
        batcher.submit([seq(*range(1, 5))], timeout_s=2 * own * pace / ADMISSION_SHARE - 1e-6)
    await batcher.close(1)


async def test_the_pace_also_scales_the_finish_of_queued_less_urgent_requests():
    clock = ManualClock()
    limits = BatchLimits(max_batch_size=4, max_batch_tokens=9, max_concurrent_batches=2)
    batcher = MicroBatcher("m", HeldBackend().infer, limits, LIMITS, clock=clock)
    exact_cost_model(batcher)
    batcher.dispatch.pace = 2.0  # batches have taken twice what they were priced at
    (early,) = batcher.submit([seq(1)], priority=0)  # 3.5 ms of work
    # At pace 2: (3.5 + 15) * 2 / 2 = 18.5 ms, within 85 % of 24.2 ms (20.57 ms): admitted.
    (promised,) = batcher.submit([seq(1, 2, 3, 4, 5)], timeout_s=0.0242, priority=1)
    # An urgent 1-token request (3.5 ms) moves it to 22 ms at pace 2: refused. (Its own 3.5 ms
    # counted at pace 1 would move it only to 20.25 ms.)
    with pytest.raises(QueueFull):
        batcher.submit([seq(1)], priority=0)
    assert not early.done() and not promised.done()
    await batcher.close(0)


def resnet_s(n: int) -> float:
    """A batch of n images: 20 ms plus 30 ms an image (ResNet-18 at 224 on a shared 2-core box,
    two sessions: about 60 images/s)."""
    return 0.020 + 0.030 * n


class StallingBackend:
    """Each batch takes `resnet_s` in the clock's time; the next one `stall_s` more."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.stall_s = 0.0

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        stall, self.stall_s = self.stall_s, 0.0
        await self.clock.sleep(resnet_s(batch.size) + stall)
        return {"total": np.zeros((batch.size, 1), dtype=np.float32)}


@pytest.mark.parametrize(
    ("priced_before", "stalled"),
    [
        (16, 1),  # two full batches at their price, then one request alone stalls
        (16, 8),  # a full batch stalls
        (0, 1),  # the first batch priced at all stalls, alone
    ],
)
async def test_one_stalled_batch_does_not_refuse_64_clients_whose_queue_drains_in_time(
    priced_before, stalled
):
    # The image bench: 64 clients, batches of at most 8, 30 s deadlines, a learned cost. One batch
    # stalls 5 s (a starved nice-10 thread, a pause): a stall adds seconds to that batch, and a
    # batch of one priced at 32.5 ms must not make 64 queued requests look 150 times their price.
    clock = ManualClock()
    backend = StallingBackend(clock)
    limits = BatchLimits(max_batch_size=8, max_concurrent_batches=2)
    batcher = MicroBatcher("m", backend.infer, limits, LIMITS, default_timeout_s=30.0, clock=clock)
    batcher.start()
    for n in range(1, 9):  # the cost model learns from batches of 1 to 8, then is ready
        await clock.run_until_done(asyncio.gather(*queue(batcher, *[4] * n)))
    assert batcher.cost_model.ready
    assert batcher.request_cost_s(4) == pytest.approx(resnet_s(8) / 8)
    if priced_before:
        await clock.run_until_done(asyncio.gather(*queue(batcher, *[4] * priced_before)))
    backend.stall_s = 5.0
    await clock.run_until_done(asyncio.gather(*queue(batcher, *[4] * stalled)), step_s=0.01)
    started = clock.now
    served = queue(batcher, *[4] * 64)  # QueueFull ("predicted late") if any is refused
    # And it was right to admit them: 8 batches of 8 over 2 slots drain in about 1 s.
    await clock.run_until_done(asyncio.gather(*served), step_s=0.01, limit_s=2.0)
    assert clock.now - started < 30.0 * ADMISSION_SHARE
    await batcher.close(0)


@pytest.mark.parametrize(("queue_size", "places"), [(64, 32), (3, 1), (1, 1)])
def test_one_request_may_take_half_the_queue_places_and_always_one(queue_size, places):
    """Issue 48: the rest of the queue stays for everyone else; a queue of one still serves."""
    assert request_places(BatchLimits(max_queue_size=queue_size)) == places
