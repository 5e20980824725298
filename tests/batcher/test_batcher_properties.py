"""Property tests: for any arrival pattern, sizes, cancellations and deadlines, every future
resolves exactly once and a batched result equals the unbatched one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from ferry.batcher import BatchLimits, MicroBatcher, PaddedBatch, SequenceLimits, TokenSequence
from hypothesis import given, settings
from hypothesis import strategies as st

VOCAB = 50


def row_value(ids: np.ndarray) -> float:
    # Depends on every real token and its position, so padding or misrouting would show.
    return float(sum((i + 1) * int(t) for i, t in enumerate(ids)))


async def backend(batch: PaddedBatch) -> dict[str, np.ndarray]:
    await asyncio.sleep(0.0005 * batch.size)
    if (batch.input_ids == VOCAB - 1).any():
        raise RuntimeError("token 49 always fails")
    values = [row_value(batch.input_ids[r, :n]) for r, n in enumerate(batch.lengths)]
    return {"value": np.asarray(values)}


@dataclass
class Arrival:
    delay_ms: int
    ids: list[int]
    cancel_after_ms: int | None
    timeout_ms: int | None


arrivals = st.lists(
    st.builds(
        Arrival,
        delay_ms=st.integers(0, 3),
        ids=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24),
        cancel_after_ms=st.none() | st.integers(0, 20),
        timeout_ms=st.none() | st.integers(1, 30),
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
)


async def scenario(pattern: list[Arrival], batch_limits: BatchLimits) -> None:
    loop = asyncio.get_running_loop()
    loop_errors: list[dict] = []
    loop.set_exception_handler(lambda _, context: loop_errors.append(context))
    batcher = MicroBatcher("p", backend, batch_limits, SequenceLimits(24, VOCAB))
    batcher.start()
    submitted: list[tuple[Arrival, asyncio.Future]] = []
    resolutions: dict[int, int] = {}
    for arrival in pattern:
        await asyncio.sleep(arrival.delay_ms / 1000)
        try:
            timeout = None if arrival.timeout_ms is None else arrival.timeout_ms / 1000
            (future,) = batcher.submit([TokenSequence.from_ids(arrival.ids)], timeout)
        except Exception as exc:  # QueueFull: refused at once, nothing queued
            assert type(exc).__name__ == "QueueFull"
            continue
        future.add_done_callback(
            lambda f: resolutions.__setitem__(id(f), resolutions.get(id(f), 0) + 1)
        )
        if arrival.cancel_after_ms is not None:
            loop.call_later(arrival.cancel_after_ms / 1000, future.cancel)
        submitted.append((arrival, future))
    await asyncio.wait_for(asyncio.gather(*(f for _, f in submitted), return_exceptions=True), 10)
    await batcher.close(1)
    for arrival, future in submitted:
        assert resolutions[id(future)] == 1
        if future.cancelled() or future.exception() is not None:
            continue
        assert future.result()["value"] == row_value(np.asarray(arrival.ids))
        assert VOCAB - 1 not in arrival.ids, "a failing input got a result"
    assert batcher.queue_depth == 0 and batcher.running_batches == 0
    assert not loop_errors, loop_errors


@settings(max_examples=40, deadline=None)
@given(pattern=arrivals, batch_limits=limits)
def test_every_future_resolves_once_with_its_unbatched_result(pattern, batch_limits):
    asyncio.run(scenario(pattern, batch_limits))
