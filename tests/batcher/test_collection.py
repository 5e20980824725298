"""Collection (batcher/collection.py) under the cost model: how many queued requests a batch
takes is bounded by the oldest request's deadline and its latency objective, whichever is first."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from ferry.batcher import BatchLimits, MicroBatcher, SequenceLimits
from ferry.batcher.packing import TensorPacking
from ferry.batcher.tensor_padding import TensorBatch, TensorLayout, TensorRows
from tests.batcher.manual_clock import ManualClock
from tests.batcher.test_admission import exact_cost_model
from tests.batcher.test_batcher import RecordingBackend, seq

pytestmark = pytest.mark.unit

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


class CostedBackend:
    """Takes exactly what `exact_cost_model` predicts, in clock time; records each batch."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.batches: list[list[int]] = []  # each batch's lengths

    async def infer(self, batch) -> dict:
        self.batches.append(list(batch.lengths))
        await self.clock.sleep(0.010 + 0.001 * batch.padded_tokens)
        return {"total": np.zeros((batch.size, 1), dtype=np.float32)}


async def long_behind_a_stream(window: float) -> tuple[float, list[list[int]]]:
    """A backlog of 8 short requests (5..12 tokens) and one of 40, then every 10 ms one new
    short request of each of those lengths: far more than the backend can serve.

    Returns how long the 40-token request took, and the batches that ran until it finished.
    """
    clock = ManualClock()
    backend = CostedBackend(clock)
    limits = BatchLimits(max_batch_size=4, max_concurrent_batches=1, fairness_window=window)
    batcher = MicroBatcher("m", backend.infer, limits, LIMITS, clock=clock)
    exact_cost_model(batcher)
    shorts = range(5, 13)
    for length in shorts:
        batcher.submit([seq(*range(1, length + 1))])
    started = clock.time()
    (long,) = batcher.submit([seq(*range(1, 41))])
    finished: list[float] = []
    long.add_done_callback(lambda _: finished.append(clock.time()))
    streamed: list[asyncio.Future] = []

    async def stream() -> None:
        await clock.sleep(0.030)  # after the backlog's fairness window (15 ms)
        while True:
            for length in shorts:
                streamed.extend(batcher.submit([seq(*range(1, length + 1))]))
            await clock.sleep(0.010)

    pump = asyncio.ensure_future(stream())
    batcher.start()
    await clock.run_until_done(long, limit_s=5)
    pump.cancel()
    await batcher.close(0)
    await asyncio.gather(*streamed, return_exceptions=True)
    return finished[0] - started, backend.batches


async def test_a_long_request_behind_a_stream_of_short_ones_is_served_within_three_batches():
    # The default window is half what a full batch saves: 0.5 * 3 fixed costs of 10 ms = 15 ms,
    # so the stream (from 30 ms on) never joins a short backlog batch: the backlog and the long
    # request go first come, first served in length groups.
    window = BatchLimits().fairness_window
    assert window == 0.5
    took, batches = await long_behind_a_stream(window)
    assert batches[:3] == [[5, 6, 7, 8], [9, 10, 11, 12], [40]]
    assert took == pytest.approx((0.010 + 0.032) + (0.010 + 0.048) + (0.010 + 0.040))


async def test_without_the_window_the_stream_passes_the_long_request_by():
    # What the window prevents: from the second batch on, each takes the oldest backlog request
    # and fresh short ones of its length, so the long request waits twice as long as with the
    # default window (both times on the ManualClock: virtual, not the wall clock's).
    took, batches = await long_behind_a_stream(window=1e9)
    assert batches[1:5] == [[9, 9, 9, 8], [10] * 4, [11] * 4, [12] * 4]
    assert batches[5] == [40]
    windowed, _ = await long_behind_a_stream(BatchLimits().fairness_window)
    assert took == pytest.approx(2 * windowed)


@pytest.mark.parametrize("ready", [False, True])
async def test_the_window_counts_arrivals_up_to_and_including_its_end(ready):
    clock = ManualClock()
    limits = BatchLimits(fairness_window=0.35)
    batcher = MicroBatcher("m", CostedBackend(clock).infer, limits, LIMITS, clock=clock)
    # 0.35 of what a full batch at the oldest's 4 tokens saves: 31 fixed costs of 10 ms with
    # the cost model (108.5 ms); before it is ready, 0.35 of the recent batch time (50 ms).
    if ready:
        exact_cost_model(batcher)
        window = 0.35 * (31 * batcher.cost_model.predict(0, 0))
        assert window == pytest.approx(0.1085)
    else:
        window = 0.35 * 0.05
    for step in (0.0, window, 0.001):
        await clock.advance(step)
        batcher.submit([seq(*FOUR)])
    assert [r.enqueued_at - 1000 for r in batcher.collection.candidates()] == pytest.approx(
        [0, window]
    )
    await batcher.close(0)


@pytest.mark.parametrize(
    ("length", "arrivals", "candidates"),
    [
        # 10 tokens hold two 4-token rows: one fixed cost (10 ms, not the 2 ms per request) saved,
        # a window of 3.5 ms.
        (4, (0.0, 0.003, 0.004), 2),
        # One 6-token row only: batching saves nothing, the window holds one instant.
        (6, (0.0, 0.0, 0.001), 2),
        # ... so one a millisecond after the oldest waits for the next batch.
        (6, (0.0, 0.001, 0.002), 1),
    ],
)
async def test_the_window_is_the_fixed_costs_a_full_batch_saves(length, arrivals, candidates):
    clock = ManualClock()
    limits = BatchLimits(max_batch_tokens=10, fairness_window=0.35)
    batcher = MicroBatcher("m", CostedBackend(clock).infer, limits, LIMITS, clock=clock)
    for n, width in [(1, 4), (2, 4), (4, 4), (1, 8), (2, 8), (4, 16), (8, 2)]:
        batcher.cost_model.observe(n, width, 0.010 + 0.002 * n + 0.001 * n * width)
    batcher.cost_model.refit()
    for at in arrivals:
        await clock.advance(at - (clock.time() - 1000))
        batcher.submit([seq(*range(1, length + 1))])
    assert len(batcher.collection.candidates()) == candidates
    await batcher.close(0)


@pytest.mark.parametrize(
    "limits",
    [
        # Switched off: batches grouped from the whole queue.
        BatchLimits(fairness_window=None),
        # Arrival order passes nobody over: a FIFO batch takes what came after a window's end.
        BatchLimits(group_by_length=False, fairness_window=0.35),
    ],
    ids=["off", "arrival-order"],
)
async def test_no_window_where_none_applies(limits):
    clock = ManualClock()
    batcher = MicroBatcher("m", CostedBackend(clock).infer, limits, LIMITS, clock=clock)
    exact_cost_model(batcher)
    for step in (0.0, 1.0, 1.0):
        await clock.advance(step)
        batcher.submit([seq(*FOUR)])
    assert len(batcher.collection.candidates()) == 3
    await batcher.close(0)


async def test_queued_lower_priority_numbers_go_first_and_a_batch_holds_one_priority():
    clock = ManualClock()
    backend = CostedBackend(clock)
    limits = BatchLimits(max_batch_size=4, max_concurrent_batches=1)
    batcher = MicroBatcher("m", backend.infer, limits, LIMITS, clock=clock)
    exact_cost_model(batcher)
    # Queued in this order before the batcher starts: 0, 0, 5, -3, 0, -3, 5 (lengths tag them).
    futures = []
    for length, priority in [(1, 0), (2, 0), (3, 5), (4, -3), (5, 0), (6, -3), (7, 5)]:
        futures += batcher.submit([seq(*range(1, length + 1))], priority=priority)
    batcher.start()
    await clock.run_until_done(asyncio.gather(*futures))
    assert backend.batches == [[4, 6], [1, 2, 5], [3, 7]]
    await batcher.close(0)


async def test_a_batch_takes_only_tensors_of_the_oldest_request_s_unpadded_shape():
    """Rows whose unpadded dynamic axes differ (their shape keys) cannot be stacked: a batch
    holds the oldest request's kind, the others wait for a batch of their own."""
    layout = TensorLayout(inputs={"x": {}})

    def rows(width: int) -> TensorRows:
        return TensorRows({"x": np.ones((1, width), np.float32)}, 1, {}, (("x.1", width),))

    batches: list[list[int]] = []

    async def infer(batch: TensorBatch) -> dict[str, np.ndarray]:
        batches.append([int(w) for w in batch.inputs["x"].sum(axis=1)])
        return {"y": batch.inputs["x"].sum(axis=1, keepdims=True)}

    clock = ManualClock()
    batcher = MicroBatcher(
        "m",
        infer,
        BatchLimits(max_queue_delay_s=0.01, dispatch_when_idle=False),
        None,
        packing=TensorPacking(layout),
        clock=clock,
    )
    batcher.start()
    futures = [f for width in (2, 3, 2) for f in batcher.submit([rows(width)])]
    answers = await clock.run_until_done(asyncio.gather(*futures))
    await batcher.close(1)
    assert batches == [[2, 2], [3]]
    assert [a["y"].tolist() for a in answers] == [[[2.0]], [[3.0]], [[2.0]]]
