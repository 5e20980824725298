"""The batcher alone, with a plain async function as the backend; timing driven by events."""

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
    InvalidInput,
    MicroBatcher,
    PaddedBatch,
    QueueFull,
    SequenceLimits,
    TokenSequence,
)

LIMITS = SequenceLimits(max_length=64, vocab_size=1000)


class RecordingBackend:
    """Sums each row's real tokens; can be held on an event to control timing."""

    def __init__(self, gate: asyncio.Event | None = None, poison: int | None = None) -> None:
        self.batches: list[PaddedBatch] = []
        self.gate = gate
        self.poison = poison

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        self.batches.append(batch)
        if self.gate is not None:
            await self.gate.wait()
        if self.poison is not None and (batch.input_ids == self.poison).any():
            raise RuntimeError("poisoned input")
        total = (batch.input_ids * batch.attention_mask).sum(axis=1, keepdims=True)
        return {"total": total.astype(np.float32), "hidden": batch.input_ids.astype(np.float32)}


def seq(*ids: int) -> TokenSequence:
    return TokenSequence.from_ids(list(ids))


def make(backend: RecordingBackend, **limits) -> MicroBatcher:
    batcher = MicroBatcher(
        "m",
        backend.infer,
        BatchLimits(**{"max_queue_delay_s": 0.01, **limits}),
        LIMITS,
        sequence_outputs=frozenset({"hidden"}),
    )
    batcher.start()
    return batcher


async def test_results_are_scattered_back_unpadded():
    backend = RecordingBackend()
    batcher = make(backend, dispatch_when_idle=False)
    futures = batcher.submit([seq(1, 2, 3), seq(4)])
    rows = await asyncio.wait_for(asyncio.gather(*futures), 5)
    assert rows[0]["total"].tolist() == [6.0] and rows[1]["total"].tolist() == [4.0]
    assert rows[1]["hidden"].tolist() == [4.0]
    assert len(backend.batches) == 1 and backend.batches[0].padded_length == 3
    await batcher.close(1)


async def test_requests_arriving_while_a_batch_runs_form_the_next_batch():
    gate = asyncio.Event()
    backend = RecordingBackend(gate)
    batcher = make(backend, max_concurrent_batches=1)
    first = batcher.submit([seq(1)])
    await asyncio.sleep(0.02)
    rest = [f for i in range(5) for f in batcher.submit([seq(i + 2)])]
    gate.set()
    await asyncio.wait_for(asyncio.gather(*first, *rest), 5)
    assert [b.size for b in backend.batches] == [1, 5]
    await batcher.close(1)


async def test_invalid_input_is_rejected_before_queueing_and_names_the_field():
    batcher = make(RecordingBackend())
    with pytest.raises(InvalidInput) as info:
        batcher.submit([seq(1), seq(5000)])
    assert info.value.field == "input_ids[1]"
    with pytest.raises(InvalidInput, match="at most 64"):
        batcher.submit([seq(*range(1, 70))])
    with pytest.raises(InvalidInput) as info:
        batcher.submit([TokenSequence.from_ids([1, 2], [1])])
    assert info.value.field == "attention_mask"
    with pytest.raises(InvalidInput):
        batcher.submit([seq()])
    assert batcher.queue_depth == 0
    await batcher.close(1)


async def test_full_queue_refuses_at_once_and_keeps_nothing():
    gate = asyncio.Event()
    batcher = make(RecordingBackend(gate), max_queue_size=3, max_concurrent_batches=1)
    running = batcher.submit([seq(1)])
    await asyncio.sleep(0.02)  # the first batch is now running and holds the only slot
    queued = batcher.submit([seq(2), seq(3)])
    with pytest.raises(QueueFull) as info:
        batcher.submit([seq(4), seq(5)])
    assert info.value.retry_after_s >= 1
    assert batcher.queue_depth == 2
    gate.set()
    await asyncio.wait_for(asyncio.gather(*running, *queued), 5)
    await batcher.close(1)


async def test_deadline_passed_in_queue_never_reaches_the_backend():
    gate = asyncio.Event()
    backend = RecordingBackend(gate)
    batcher = make(backend, max_concurrent_batches=1)
    blocker = batcher.submit([seq(1)])
    await asyncio.sleep(0.02)
    (late,) = batcher.submit([seq(7)], timeout_s=0.01)
    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(late, 5)
    gate.set()
    await asyncio.wait_for(asyncio.gather(*blocker), 5)
    await asyncio.sleep(0.05)
    assert all(7 not in b.input_ids for b in backend.batches)
    await batcher.close(1)


async def test_cancelled_request_is_dropped_before_dispatch():
    gate = asyncio.Event()
    backend = RecordingBackend(gate)
    batcher = make(backend, max_concurrent_batches=1)
    blocker = batcher.submit([seq(1)])
    await asyncio.sleep(0.02)
    (gone,) = batcher.submit([seq(9)])
    (kept,) = batcher.submit([seq(8)])
    gone.cancel()
    gate.set()
    await asyncio.wait_for(asyncio.gather(*blocker, kept), 5)
    assert all(9 not in b.input_ids for b in backend.batches)
    assert batcher.queue_depth == 0
    await batcher.close(1)


async def test_one_bad_request_does_not_fail_its_batch():
    backend = RecordingBackend(poison=666)
    batcher = make(backend, dispatch_when_idle=False)
    futures = batcher.submit([seq(1), seq(666), seq(3)])
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)
    assert results[0]["total"].tolist() == [1.0]
    assert isinstance(results[1], InferenceFailed)
    assert results[2]["total"].tolist() == [3.0]
    await batcher.close(1)


async def test_batch_wide_failure_fails_every_member_without_retry():
    async def down(batch: PaddedBatch):
        calls.append(batch.size)
        raise BackendUnavailable("backend is down")

    calls: list[int] = []
    batcher = MicroBatcher("m", down, BatchLimits(dispatch_when_idle=False), LIMITS)
    batcher.start()
    futures = batcher.submit([seq(1), seq(2)])
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)
    assert all(isinstance(r, BackendUnavailable) for r in results)
    assert calls == [2]
    await batcher.close(1)


async def test_wrong_number_of_output_rows_fails_instead_of_misrouting():
    async def short(batch: PaddedBatch):
        return {"total": np.zeros((1, 1))}

    batcher = MicroBatcher("m", short, BatchLimits(dispatch_when_idle=False), LIMITS)
    batcher.start()
    futures = batcher.submit([seq(1)])
    futures += batcher.submit([seq(2)])
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5)
    # Retried alone, each row count is right again: a short batch output never misroutes.
    assert [r["total"].shape for r in results] == [(1,), (1,)]
    await batcher.close(1)


async def test_close_drains_queued_work_and_refuses_new():
    gate = asyncio.Event()
    batcher = make(RecordingBackend(gate), max_concurrent_batches=1)
    futures = batcher.submit([seq(1)])
    await asyncio.sleep(0.02)
    futures += batcher.submit([seq(2)])
    closing = asyncio.create_task(batcher.close(5))
    await asyncio.sleep(0.02)
    with pytest.raises(BatcherClosed):
        batcher.submit([seq(3)])
    gate.set()
    await asyncio.wait_for(closing, 5)
    assert all(f.done() and not f.exception() for f in futures)


async def test_close_after_drain_timeout_fails_what_is_left():
    batcher = make(RecordingBackend(asyncio.Event()), max_concurrent_batches=1)
    futures = batcher.submit([seq(1)])
    await asyncio.sleep(0.02)
    futures += batcher.submit([seq(2)])
    await asyncio.wait_for(batcher.close(0.05), 5)
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, BatchAbandoned) for r in results)


async def test_calibration_seeds_the_cost_model_and_live_batches_refine_it():
    backend = RecordingBackend()
    batcher = make(backend, max_batch_size=8, max_batch_tokens=512)
    await batcher.calibrate()
    assert batcher.cost_model.ready
    calibration_batches = len(backend.batches)
    futures = batcher.submit([seq(1, 2), seq(3)])
    await asyncio.wait_for(asyncio.gather(*futures), 5)
    assert len(backend.batches) > calibration_batches


async def test_latency_objective_keeps_predicted_batches_inside_it():
    async def slow(batch: PaddedBatch) -> dict[str, np.ndarray]:
        # 10 ms per request: a batch of n takes n * 10 ms.
        await asyncio.sleep(0.01 * batch.size)
        return {"total": np.zeros((batch.size, 1))}

    batcher = MicroBatcher(
        "m",
        slow,
        BatchLimits(max_batch_size=32, latency_objective_s=0.06, dispatch_when_idle=False),
        LIMITS,
    )
    await batcher.calibrate([(1, 8), (2, 8), (4, 8), (8, 8), (1, 16), (4, 16)])
    sizes: list[int] = []
    original = batcher._infer

    async def recording(batch: PaddedBatch):
        sizes.append(batch.size)
        return await original(batch)

    batcher._infer = recording
    batcher.start()
    futures = [f for i in range(20) for f in batcher.submit([seq(i + 1)])]
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    # The cost model knows 32 at once would take ~320 ms: batches stay within the 60 ms objective.
    assert sizes and max(sizes) <= 6
    await batcher.close(1)


async def test_hung_backend_fails_its_batch_and_the_batcher_keeps_serving():
    calls = 0

    async def sometimes_hangs(batch: PaddedBatch) -> dict[str, np.ndarray]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.Event().wait()  # never answers
        return {"total": np.ones((batch.size, 1))}

    batcher = MicroBatcher(
        "m", sometimes_hangs, BatchLimits(dispatch_when_idle=True), LIMITS, infer_timeout_s=0.05
    )
    batcher.start()
    (hung,) = batcher.submit([seq(1)])
    with pytest.raises(InferenceTimedOut):
        await asyncio.wait_for(hung, 5)
    (later,) = batcher.submit([seq(2)])
    assert (await asyncio.wait_for(later, 5))["total"].tolist() == [1.0]
    await batcher.close(1)
