"""Collection (batcher/collection.py) under the cost model: how many queued requests a batch
takes is bounded by the oldest request's deadline and its latency objective, whichever is first."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ferry.batcher import BatchLimits, MicroBatcher, SequenceLimits
from tests.batcher.manual_clock import ManualClock
from tests.batcher.test_admission import exact_cost_model
from tests.batcher.test_batcher import RecordingBackend, seq

LIMITS = SequenceLimits(max_length=64, vocab_size=1000)
FOUR = (1, 2, 3, 4)  # predict(n, 4) = 10 ms + 4 ms per request


async def first_batch_size(timeout_s: float | None, objective_s: float | None) -> int:
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = MicroBatcher(
        "m",
        backend.infer,
        BatchLimits(max_batch_size=8, latency_objective_s=objective_s),
        LIMITS,
        clock=clock,
    )
    exact_cost_model(batcher)
    batcher.start()
    futures = batcher.submit([seq(*FOUR) for _ in range(8)], timeout_s=timeout_s)
    await clock.run_until_done(asyncio.gather(*futures, return_exceptions=True))
    await batcher.close(1)
    return backend.batches[0].size


@pytest.mark.parametrize(
    ("timeout_s", "objective_s", "size"),
    [
        (None, None, 8),  # no time limit: the fixed cost makes the largest batch best
        (0.024, None, 3),  # 10 + 4n ms within 24 ms: 3
        (None, 0.027, 4),  # the objective alone: 4
        (0.024, 0.033, 3),  # both: the deadline comes first
        (0.033, 0.027, 4),  # both: the objective comes first
    ],
)
async def test_a_batch_is_as_large_as_finishes_before_the_first_limit(timeout_s, objective_s, size):
    assert await first_batch_size(timeout_s, objective_s) == size


def steered(backend: RecordingBackend, clock: ManualClock, objective_s: float) -> MicroBatcher:
    batcher = MicroBatcher(
        "m",
        backend.infer,
        BatchLimits(max_batch_size=8, latency_objective_s=objective_s, dispatch_when_idle=False),
        LIMITS,
        clock=clock,
    )
    exact_cost_model(batcher)
    batcher.start()
    return batcher


async def test_until_the_cost_model_is_ready_an_objective_waits_only_the_queue_delay():
    clock, backend = ManualClock(), RecordingBackend()
    limits = BatchLimits(
        max_batch_size=8, latency_objective_s=1.0, max_queue_delay_s=0.002, dispatch_when_idle=False
    )
    batcher = MicroBatcher("m", backend.infer, limits, LIMITS, clock=clock)
    batcher.start()
    assert not batcher.cost_model.ready  # nothing observed, nothing fitted
    future = batcher.submit([seq(*FOUR)])
    await clock.advance(0.001)
    assert backend.batches == []
    await clock.advance(0.001)
    assert len(backend.batches) == 1  # the queue delay, not a wait steered by the objective
    await clock.run_until_done(asyncio.gather(*future))
    await batcher.close(1)


async def test_a_steered_wait_rechecks_the_cost_model_every_quarter_objective():
    clock, backend = ManualClock(), RecordingBackend()
    batcher = steered(backend, clock, 1.0)
    # A full batch costs 42 ms: the oldest could wait 458 ms, in waits of at most 250 ms.
    future = batcher.submit([seq(*FOUR)])
    await clock.advance(0.125)  # (binary fractions: the clock lands on 250 ms exactly)
    # Batches turn out far dearer (a refit after other work): a full one now costs well over
    # the objective, so at the next check (250 ms) there is no slack left.
    for n, length in [(1, 4), (2, 4), (4, 4), (1, 8), (2, 8), (4, 16), (8, 2)]:
        batcher.cost_model.observe(n, length, 0.010 + 0.1 * n * length)
    batcher.cost_model.refit()
    await clock.advance(0.09375)
    assert backend.batches == []  # 219 ms: still within the first wait
    await clock.advance(0.03125)
    assert len(backend.batches) == 1  # 250 ms: the check finds no slack and sends it
    await clock.run_until_done(asyncio.gather(*future))
    await batcher.close(1)


async def test_waiting_idle_or_for_a_window_starts_no_empty_batch(caplog):
    caplog.set_level(logging.WARNING, logger="ferry.batcher")
    clock, backend = ManualClock(), RecordingBackend()
    batcher = MicroBatcher(
        "m",
        backend.infer,
        BatchLimits(max_queue_delay_s=0.01, dispatch_when_idle=False),
        LIMITS,
        clock=clock,
    )
    batcher.start()
    await clock.advance(0.05)  # idle
    futures = batcher.submit([seq(1)])
    await clock.advance(0.005)
    futures += batcher.submit([seq(2)])  # wakes the window's wait early
    await clock.run_until_done(asyncio.gather(*futures))
    await clock.advance(0.05)  # idle again
    assert [b.size for b in backend.batches] == [2]
    assert batcher.running_batches == 0
    assert caplog.records == []
    await batcher.close(1)
