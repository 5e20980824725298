"""The batcher alone, with a plain async function as the backend. Time is a manual clock the
tests advance: no test waits on the wall clock, so none can be flaky on a loaded machine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ferry.backends.errors import BackendUnavailable
from ferry.batcher import (
    BatchAbandoned,
    BatcherClosed,
    BatchLimits,
    DeadlineExceeded,
    InferenceFailed,
    InferenceTimedOut,
    MicroBatcher,
    PaddedBatch,
    QueueFull,
    SequenceLimits,
    TokenSequence,
)
from tests.batcher.manual_clock import ManualClock, settle

pytestmark = pytest.mark.unit

LIMITS = SequenceLimits(max_length=64, vocab_size=1000)


class RecordingBackend:
    """Sums each row's real tokens; can be held on an event to control timing."""

    def __init__(
        self,
        gate: asyncio.Event | None = None,
        poison: int | None = None,
        clock: ManualClock | None = None,
    ) -> None:
        self.batches: list[PaddedBatch] = []
        self.gate = gate
        self.poison = poison
        self.clock = clock  # when given, a batch takes 1 ms per padded token of clock time

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        self.batches.append(batch)
        if self.gate is not None:
            await self.gate.wait()
        if self.clock is not None:
            await self.clock.sleep(0.001 * batch.padded_tokens)
        if self.poison is not None and (batch.input_ids == self.poison).any():
            raise RuntimeError("poisoned input")
        total = (batch.input_ids * batch.attention_mask).sum(axis=1, keepdims=True)
        return {"total": total.astype(np.float32), "hidden": batch.input_ids.astype(np.float32)}


def seq(*ids: int) -> TokenSequence:
    return TokenSequence.from_ids(list(ids))


def make(backend: RecordingBackend, clock: ManualClock, **limits) -> MicroBatcher:
    batcher = MicroBatcher(
        "m",
        backend.infer,
        BatchLimits(**{"max_queue_delay_s": 0.01, **limits}),
        LIMITS,
        sequence_outputs=frozenset({"hidden"}),
        clock=clock,
    )
    batcher.start()
    return batcher


def never_answering(clock: ManualClock, **options) -> tuple[MicroBatcher, asyncio.Future]:
    """A started batcher whose backend never answers, and one request submitted to it."""
    backend = RecordingBackend(asyncio.Event())
    batcher = MicroBatcher("m", backend.infer, BatchLimits(), LIMITS, clock=clock, **options)
    batcher.start()
    (future,) = batcher.submit([seq(1)])
    return batcher, future


async def one_batch_running(
    clock: ManualClock, **limits
) -> tuple[asyncio.Event, RecordingBackend, MicroBatcher, list[asyncio.Future]]:
    """A batcher with one slot, held by a running batch of one request until `gate` is set."""
    gate = asyncio.Event()
    backend = RecordingBackend(gate)
    batcher = make(backend, clock, max_concurrent_batches=1, **limits)
    running = batcher.submit([seq(1)])
    await settle()
    return gate, backend, batcher, running


async def test_results_are_scattered_back_unpadded():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = make(backend, clock, dispatch_when_idle=False)
    futures = batcher.submit([seq(1, 2, 3), seq(4)])
    rows = await clock.run_until_done(asyncio.gather(*futures))
    assert rows[0]["total"].tolist() == [6.0] and rows[1]["total"].tolist() == [4.0]
    assert rows[0]["hidden"].tolist() == [1.0, 2.0, 3.0] and rows[1]["hidden"].tolist() == [4.0]
    assert len(backend.batches) == 1 and backend.batches[0].padded_length == 3
    await batcher.close(1)


async def test_the_delay_window_holds_the_batch_open_until_it_ends():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = make(backend, clock, dispatch_when_idle=False, max_queue_delay_s=0.01)
    first = batcher.submit([seq(1)])
    await clock.advance(0.009)
    assert backend.batches == []  # still inside the window: nothing sent
    second = batcher.submit([seq(2)])
    await clock.advance(0.001)
    await clock.run_until_done(asyncio.gather(*first, *second))
    assert [b.size for b in backend.batches] == [2]
    await batcher.close(1)


async def test_a_full_batch_goes_at_once_without_waiting_for_the_window():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = make(backend, clock, dispatch_when_idle=False, max_batch_size=2)
    futures = batcher.submit([seq(1), seq(2)])
    await settle()
    assert [b.size for b in backend.batches] == [2]
    await asyncio.gather(*futures)
    await batcher.close(1)


async def test_requests_arriving_while_a_batch_runs_form_the_next_batch():
    clock = ManualClock()
    gate, backend, batcher, first = await one_batch_running(clock)
    rest = [f for i in range(5) for f in batcher.submit([seq(i + 2)])]
    assert batcher.queue_depth == 5 and batcher.running_batches == 1
    gate.set()
    await clock.run_until_done(asyncio.gather(*first, *rest))
    assert [b.size for b in backend.batches] == [1, 5]
    await batcher.close(1)


async def test_unvalidated_input_is_asserted_against_and_nothing_is_queued():
    # The server validates (encoder_validation.py); the batcher only asserts what it relies on.
    batcher = make(RecordingBackend(), ManualClock())
    for bad in ([seq(1), seq(*range(1, 70))], [TokenSequence.from_ids([1, 2], [1])], [seq()]):
        with pytest.raises(AssertionError):
            batcher.submit(bad)
    assert batcher.queue_depth == 0
    await batcher.close(1)


async def test_full_queue_refuses_at_once_and_keeps_nothing():
    clock = ManualClock()
    gate, _, batcher, running = await one_batch_running(clock, max_queue_size=3)
    queued = batcher.submit([seq(2), seq(3)])
    with pytest.raises(QueueFull) as info:
        batcher.submit([seq(4), seq(5)])
    assert info.value.retry_after_s >= 1
    assert batcher.queue_depth == 2
    batcher.submit([seq(6)])  # exactly at the bound: still taken
    assert batcher.queue_depth == 3
    gate.set()
    await clock.run_until_done(asyncio.gather(*running, *queued))
    await batcher.close(1)


async def test_deadline_passed_in_queue_never_reaches_the_backend():
    clock = ManualClock()
    gate, backend, batcher, blocker = await one_batch_running(clock)
    (late,) = batcher.submit([seq(7)], timeout_s=0.01)
    await clock.advance(0.009)
    assert not late.done()  # not before its deadline
    await clock.advance(0.001)
    with pytest.raises(DeadlineExceeded):
        late.result()
    gate.set()
    await clock.run_until_done(asyncio.gather(*blocker))
    await clock.advance(0.05)
    assert all(7 not in b.input_ids for b in backend.batches)
    await batcher.close(1)


async def test_default_timeout_applies_when_the_request_sets_none():
    clock = ManualClock()
    batcher, waiting = never_answering(clock, default_timeout_s=0.5)
    await clock.advance(0.499)
    assert not waiting.done()
    await clock.advance(0.001)
    assert isinstance(waiting.exception(), DeadlineExceeded)
    await batcher.close(0)


async def test_cancelled_request_is_dropped_before_dispatch():
    clock = ManualClock()
    gate, backend, batcher, blocker = await one_batch_running(clock)
    (gone,) = batcher.submit([seq(9)])
    (kept,) = batcher.submit([seq(8)])
    gone.cancel()
    gate.set()
    await clock.run_until_done(asyncio.gather(*blocker, kept))
    assert all(9 not in b.input_ids for b in backend.batches)
    assert batcher.queue_depth == 0
    await batcher.close(1)


async def test_one_bad_request_does_not_fail_its_batch():
    clock = ManualClock()
    backend = RecordingBackend(poison=666)
    batcher = make(backend, clock, dispatch_when_idle=False)
    futures = batcher.submit([seq(1), seq(666), seq(3)])
    results = await clock.run_until_done(asyncio.gather(*futures, return_exceptions=True))
    assert results[0]["total"].tolist() == [1.0]
    assert isinstance(results[1], InferenceFailed) and "poisoned input" in str(results[1])
    assert results[2]["total"].tolist() == [3.0]
    # One batch of three, then each member alone.
    assert [b.size for b in backend.batches] == [3, 1, 1, 1]
    await batcher.close(1)


async def test_batch_wide_failure_fails_every_member_without_retry():
    async def down(batch: PaddedBatch):
        calls.append(batch.size)
        raise BackendUnavailable("backend is down")

    calls: list[int] = []
    clock = ManualClock()
    batcher = MicroBatcher("m", down, BatchLimits(dispatch_when_idle=False), LIMITS, clock=clock)
    batcher.start()
    futures = batcher.submit([seq(1), seq(2)])
    results = await clock.run_until_done(asyncio.gather(*futures, return_exceptions=True))
    assert all(isinstance(r, BackendUnavailable) for r in results)
    assert calls == [2]
    await batcher.close(1)


async def test_wrong_number_of_output_rows_fails_instead_of_misrouting():
    async def short(batch: PaddedBatch):
        return {"total": np.zeros((1, 1))}

    clock = ManualClock()
    batcher = MicroBatcher("m", short, BatchLimits(dispatch_when_idle=False), LIMITS, clock=clock)
    batcher.start()
    futures = batcher.submit([seq(1)])
    futures += batcher.submit([seq(2)])
    results = await clock.run_until_done(asyncio.gather(*futures, return_exceptions=True))
    # Retried alone, each row count is right again: a short batch output never misroutes.
    assert [r["total"].shape for r in results] == [(1,), (1,)]
    await batcher.close(1)


async def test_close_drains_queued_work_and_refuses_new():
    clock = ManualClock()
    gate, _, batcher, futures = await one_batch_running(clock)
    futures += batcher.submit([seq(2)])
    closing = asyncio.create_task(batcher.close(5))
    await settle()
    with pytest.raises(BatcherClosed):
        batcher.submit([seq(3)])
    gate.set()
    await asyncio.wait_for(closing, 5)
    assert all(f.done() and not f.exception() for f in futures)


async def test_close_after_drain_timeout_fails_what_is_left():
    clock = ManualClock()
    batcher = make(RecordingBackend(asyncio.Event()), clock, max_concurrent_batches=1)
    futures = batcher.submit([seq(1)])
    await settle()
    futures += batcher.submit([seq(2)])
    # The backend never answers: the (real, short) drain timeout is what ends the wait.
    await asyncio.wait_for(batcher.close(0.05), 5)
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, BatchAbandoned) for r in results)
    assert batcher.queue_depth == 0 and batcher.running_batches == 0


async def test_calibration_seeds_the_cost_model_and_live_batches_refine_it():
    clock = ManualClock()
    backend = RecordingBackend(clock=clock)
    batcher = make(backend, clock, max_batch_size=8, max_batch_tokens=512)
    await clock.run_until_done(batcher.calibrate(), step_s=0.05)
    assert batcher.cost_model.ready
    # 1 ms per padded token, learned from the warm-up batches' clock time.
    assert abs(batcher.cost_model.predict(4, 32) - 0.128) < 0.005
    calibration_batches = len(backend.batches)
    futures = batcher.submit([seq(1, 2), seq(3)])
    await clock.run_until_done(asyncio.gather(*futures))
    assert len(backend.batches) > calibration_batches
    await batcher.close(1)


async def test_latency_objective_keeps_predicted_batches_inside_it():
    clock = ManualClock()
    sizes: list[int] = []

    async def slow(batch: PaddedBatch) -> dict[str, np.ndarray]:
        # 10 ms per request (clock time): a batch of n takes n * 10 ms.
        sizes.append(batch.size)
        await clock.sleep(0.01 * batch.size)
        return {"total": np.zeros((batch.size, 1))}

    batcher = MicroBatcher(
        "m",
        slow,
        BatchLimits(max_batch_size=32, latency_objective_s=0.06, dispatch_when_idle=False),
        LIMITS,
        clock=clock,
    )
    await clock.run_until_done(
        batcher.calibrate([(1, 8), (2, 8), (4, 8), (8, 8), (1, 16), (4, 16)])
    )
    assert abs(batcher.cost_model.predict(32, 8) - 0.32) < 0.01
    sizes.clear()
    batcher.start()
    futures = [f for i in range(20) for f in batcher.submit([seq(i + 1)])]
    await clock.run_until_done(asyncio.gather(*futures))
    # The cost model knows 32 at once would take ~320 ms: batches stay within the 60 ms objective.
    assert sizes and max(sizes) <= 6 and sum(sizes) == 20
    await batcher.close(1)


async def test_hung_backend_fails_its_batch_and_the_batcher_keeps_serving():
    calls = 0

    async def sometimes_hangs(batch: PaddedBatch) -> dict[str, np.ndarray]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.Event().wait()  # never answers
        return {"total": np.ones((batch.size, 1))}

    clock = ManualClock()
    batcher = MicroBatcher(
        "m",
        sometimes_hangs,
        BatchLimits(dispatch_when_idle=True),
        LIMITS,
        infer_timeout_s=0.05,
        clock=clock,
    )
    batcher.start()
    (hung,) = batcher.submit([seq(1)])
    await clock.advance(0.049)
    assert not hung.done()
    await clock.advance(0.001)
    with pytest.raises(InferenceTimedOut, match=r"0\.05s"):
        hung.result()
    (later,) = batcher.submit([seq(2)])
    assert (await clock.run_until_done(later))["total"].tolist() == [1.0]
    await batcher.close(1)


async def test_batches_are_padded_with_the_models_pad_token():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = MicroBatcher(
        "m",
        backend.infer,
        BatchLimits(dispatch_when_idle=False),
        LIMITS,
        pad_token_id=7,
        clock=clock,
    )
    batcher.start()
    await clock.run_until_done(asyncio.gather(*batcher.submit([seq(1, 2), seq(3)])))
    assert backend.batches[0].input_ids.tolist() == [[1, 2], [3, 7]]
    await batcher.close(1)
