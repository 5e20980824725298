"""Property tests: for any arrival pattern, sizes, cancellations and deadlines, every future
resolves exactly once; every arrival that was not cancelled, not timed out and not deliberately
bad gets a result, and that result equals the unbatched one. Time is a manual clock, so the
examples are deterministic and fast.

Two deliberately broken batchers prove the property can fail: one that fails a whole batch for
one bad member, one that never succeeds."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ferry.batcher import (
    BatchLimits,
    DeadlineExceeded,
    InferenceFailed,
    MicroBatcher,
    PaddedBatch,
    QueueFull,
    SequenceLimits,
    TokenSequence,
    pad_batch,
)
from ferry.batcher.dispatch import Dispatch
from tests.batcher.manual_clock import ManualClock

pytestmark = pytest.mark.unit

VOCAB = 50
BAD = VOCAB - 1  # a token the backend always fails on
# `make mutation` runs fewer examples per mutant; the suite runs the full number.
EXAMPLES = int(os.environ.get("FERRY_PROPERTY_EXAMPLES", "200"))


def row_value(ids: list[int] | np.ndarray) -> float:
    # Depends on every real token and its position, so padding or misrouting would show.
    return float(sum((i + 1) * int(t) for i, t in enumerate(ids)))


@dataclass
class Arrival:
    delay_ms: int
    ids: list[int]
    cancel_after_ms: int | None
    timeout_ms: int | None
    priority: int = 0


arrivals = st.lists(
    st.builds(
        Arrival,
        delay_ms=st.integers(0, 3),
        ids=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
        cancel_after_ms=st.none() | st.integers(0, 20),
        timeout_ms=st.none() | st.integers(1, 30),
        priority=st.integers(-2, 2),
    ),
    min_size=1,
    max_size=40,
)
limits = st.builds(
    BatchLimits,
    max_batch_size=st.integers(1, 16),
    max_batch_tokens=st.integers(24, 400),
    max_queue_delay_s=st.sampled_from([0.0, 0.001, 0.005]),
    max_queue_size=st.integers(1, 64),
    max_concurrent_batches=st.integers(1, 3),
    group_by_length=st.booleans(),
    dispatch_when_idle=st.booleans(),
    fairness_window=st.sampled_from([0.0, 0.5, 1e9]),
)


@dataclass
class Outcome:
    arrival: Arrival
    future: asyncio.Future
    submitted_at: float
    resolved_at: list[float]


async def scenario(
    pattern: list[Arrival], batch_limits: BatchLimits, batcher_class: type[MicroBatcher]
) -> None:
    loop = asyncio.get_running_loop()
    loop_errors: list[dict] = []
    loop.set_exception_handler(lambda _, context: loop_errors.append(context))
    clock = ManualClock()

    async def backend(batch: PaddedBatch) -> dict[str, np.ndarray]:
        await clock.sleep(0.0005 * batch.size)
        if (batch.input_ids == BAD).any():
            raise RuntimeError(f"token {BAD} always fails")
        values = [row_value(batch.input_ids[r, :n]) for r, n in enumerate(batch.lengths)]
        return {"value": np.asarray(values)}

    batcher = batcher_class("p", backend, batch_limits, SequenceLimits(24, VOCAB), clock=clock)
    batcher.start()
    outcomes: list[Outcome] = []
    for arrival in pattern:
        await clock.advance(arrival.delay_ms / 1000)
        timeout = None if arrival.timeout_ms is None else arrival.timeout_ms / 1000
        try:
            (future,) = batcher.submit(
                [TokenSequence.from_ids(arrival.ids)], timeout, priority=arrival.priority
            )
        except QueueFull:
            continue  # refused at once, nothing queued
        outcome = Outcome(arrival, future, clock.time(), [])
        future.add_done_callback(lambda _, o=outcome: o.resolved_at.append(clock.time()))
        if arrival.cancel_after_ms is not None:
            clock.call_at(clock.time() + arrival.cancel_after_ms / 1000, future.cancel)
        outcomes.append(outcome)
    futures = [o.future for o in outcomes]
    await clock.run_until_done(asyncio.gather(*futures, return_exceptions=True), limit_s=2)
    await batcher.close(1)
    for outcome in outcomes:
        check_outcome(outcome)
    assert batcher.queue_depth == 0 and batcher.running_batches == 0
    assert not loop_errors, loop_errors


def check_outcome(outcome: Outcome) -> None:
    arrival, future = outcome.arrival, outcome.future
    assert len(outcome.resolved_at) == 1, "a future resolved more than once (or never)"
    waited_ms = (outcome.resolved_at[0] - outcome.submitted_at) * 1000
    if future.cancelled():
        assert arrival.cancel_after_ms is not None, "cancelled, but nobody cancelled it"
        assert waited_ms >= arrival.cancel_after_ms - 1e-6
        return
    error = future.exception()
    if isinstance(error, DeadlineExceeded):
        assert arrival.timeout_ms is not None, "timed out without a deadline"
        assert waited_ms >= arrival.timeout_ms - 1e-6, "timed out before its deadline"
        return
    if isinstance(error, InferenceFailed):
        assert BAD in arrival.ids, f"a good input failed: {error}"
        return
    assert error is None, f"unexpected error {error!r}"
    assert BAD not in arrival.ids, "a failing input got a result"
    assert future.result()["value"] == row_value(arrival.ids)


def run_property(batcher_class: type[MicroBatcher], examples: int, shrink: bool = True) -> None:
    @settings(
        max_examples=examples,
        # Shrinking only makes a failure readable; the broken batchers need just the failure.
        phases=list(Phase) if shrink else [Phase.generate],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(pattern=arrivals, batch_limits=limits)
    def check(pattern: list[Arrival], batch_limits: BatchLimits) -> None:
        asyncio.run(scenario(pattern, batch_limits, batcher_class))

    check()


def test_every_arrival_gets_its_unbatched_result_unless_cancelled_timed_out_or_bad():
    run_property(MicroBatcher, EXAMPLES)


class FailsTheWholeBatchDispatch(Dispatch):
    """Broken: one bad member fails every member of its batch (no retry alone)."""

    async def _run_batch(self, batch) -> None:
        padded = pad_batch([r.sequence for r in batch])
        try:
            rows = await self._infer_rows(padded, 0.0)
        except Exception as exc:
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(InferenceFailed(str(exc)))
            return
        for request, row in zip(batch, rows, strict=True):
            if not request.future.done():
                request.future.set_result(row)


class NeverSucceedsDispatch(Dispatch):
    """Broken: every request fails."""

    async def _run_batch(self, batch) -> None:
        for request in batch:
            if not request.future.done():
                request.future.set_exception(InferenceFailed("broken"))


class FailsTheWholeBatch(MicroBatcher):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch.__class__ = FailsTheWholeBatchDispatch  # the part under test, broken


class NeverSucceeds(MicroBatcher):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch.__class__ = NeverSucceedsDispatch


@pytest.mark.parametrize("broken", [FailsTheWholeBatch, NeverSucceeds])
def test_the_property_fails_on_a_broken_batcher(broken):
    with pytest.raises(AssertionError, match="a good input failed"):
        run_property(broken, EXAMPLES, shrink=False)
