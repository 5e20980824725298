"""Dispatch (batcher/dispatch.py) and the batcher's stop: what each member's future carries on
every path out of a batch, the runs-alone hint, the union of outputs, and the logs of a crash."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from ferry.batcher import (
    BatchAbandoned,
    BatchLimits,
    DeadlineExceeded,
    InferenceFailed,
    MicroBatcher,
    PaddedBatch,
)
from tests.batcher.manual_clock import ManualClock, settle
from tests.batcher.test_batcher import LIMITS, RecordingBackend, make, seq
from tests.batcher.test_batcher_observer import make as make_observed

pytestmark = pytest.mark.unit


class Catastrophe(BaseException):
    """Not an Exception: what no `except Exception` in the batcher catches."""


async def test_a_batch_left_by_an_unforeseen_path_fails_its_members_and_logs_the_crash(caplog):
    caplog.set_level(logging.ERROR, logger="ferry.batcher")
    calls = 0

    async def breaks_once(batch: PaddedBatch) -> dict[str, np.ndarray]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Catastrophe("backend blew up")
        return {"total": np.ones((batch.size, 1), dtype=np.float32)}

    clock = ManualClock()
    batcher = MicroBatcher(
        "m", breaks_once, BatchLimits(max_concurrent_batches=1), LIMITS, clock=clock
    )
    batcher.start()
    first = batcher.submit([seq(1), seq(2)])
    await settle()
    for future in first:
        error = future.exception()
        assert isinstance(error, InferenceFailed)
        assert str(error) == "the batch ended without a result"
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "model m: batch dispatch crashed"
    assert isinstance(record.exc_info[1], Catastrophe)
    # Its slot came back: the next request is served.
    (second,) = batcher.submit([seq(3)])
    await settle()
    assert second.result()["total"].tolist() == [1.0]
    assert batcher.running_batches == 0
    await batcher.close(1)


class CollectorBug(MicroBatcher):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)

        async def next_batch():
            raise RuntimeError("a bug in collection")

        self.collection.next_batch = next_batch  # type: ignore[method-assign]


async def test_a_dead_collector_is_logged_critical_with_its_traceback(caplog):
    caplog.set_level(logging.ERROR, logger="ferry.batcher")
    batcher = CollectorBug(
        "m", RecordingBackend().infer, BatchLimits(), LIMITS, clock=ManualClock()
    )
    batcher.start()
    await settle()
    (record,) = caplog.records
    assert record.levelno == logging.CRITICAL
    assert record.getMessage() == "model m: batcher loop died"
    assert str(record.exc_info[1]) == "a bug in collection"
    with pytest.raises(RuntimeError, match="a bug in collection"):
        await batcher.close(0)  # and stopping the batcher reports it again


async def test_a_stop_names_the_model_for_running_and_queued_requests():
    clock = ManualClock()
    gate = asyncio.Event()
    batcher = make(RecordingBackend(gate), clock, max_concurrent_batches=1, max_batch_size=1)
    running = batcher.submit([seq(1)])
    await settle()
    queued = batcher.submit([seq(2)])
    await batcher.close(0)
    # Resolved by the time close returns: it waits for the cancelled batches to finish.
    for future in running + queued:
        assert future.done()
        assert isinstance(future.exception(), BatchAbandoned)
        assert str(future.exception()) == "model 'm' stopped"


async def test_a_passed_deadline_says_so():
    clock = ManualClock()
    batcher = make(RecordingBackend(asyncio.Event()), clock, max_concurrent_batches=1)
    batcher.submit([seq(1)])  # holds the only slot
    (late,) = batcher.submit([seq(2)], timeout_s=0.5)
    await clock.advance(0.5)
    assert isinstance(late.exception(), DeadlineExceeded)
    assert str(late.exception()) == "the request's deadline passed"
    await batcher.close(0)


async def test_a_backend_answering_the_wrong_number_of_rows_fails_the_request_saying_so():
    async def one_row_too_many(batch: PaddedBatch) -> dict[str, np.ndarray]:
        return {"total": np.zeros((batch.size + 1, 5), dtype=np.float32)}

    batcher = MicroBatcher("m", one_row_too_many, BatchLimits(), LIMITS, clock=ManualClock())
    batcher.start()
    (future,) = batcher.submit([seq(1)])
    await settle()
    assert str(future.exception()) == (
        "inference failed: output 'total' has 2 rows for a batch of 1"
    )
    await batcher.close(0)


async def test_only_a_batch_with_nothing_else_queued_or_running_runs_alone():
    clock = ManualClock()
    backend = RecordingBackend()
    # One slot: the first batch leaves the second queued, the second has the machine to itself.
    batcher = make(backend, clock, max_batch_size=1, max_concurrent_batches=1)
    await clock.run_until_done(asyncio.gather(*batcher.submit([seq(1), seq(2)])))
    assert [b.runs_alone for b in backend.batches] == [False, True]
    await batcher.close(1)
    # Two slots: a batch formed while another runs does not run alone.
    gate = asyncio.Event()
    backend = RecordingBackend(gate)
    batcher = make(backend, clock, max_batch_size=1, max_concurrent_batches=2)
    futures = batcher.submit([seq(1)])
    await settle()
    futures += batcher.submit([seq(2)])
    await settle()
    gate.set()
    await clock.run_until_done(asyncio.gather(*futures))
    assert [b.runs_alone for b in backend.batches] == [True, False]
    await batcher.close(1)


async def test_a_batch_fetches_the_union_of_what_its_members_asked_for():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = make(backend, clock, dispatch_when_idle=False)
    futures = batcher.submit([seq(1)], outputs=frozenset({"total"}))
    futures += batcher.submit([seq(2)], outputs=frozenset({"hidden"}))
    rows = await clock.run_until_done(asyncio.gather(*futures))
    assert backend.batches[0].outputs == ("hidden", "total")
    assert all({"hidden", "total"} <= set(row) for row in rows)
    await batcher.close(1)


async def test_a_prediction_is_reported_only_once_the_cost_model_is_ready():
    clock = ManualClock()
    batcher, observer = make_observed(clock, RecordingBackend(clock=clock))
    batcher.start()
    await clock.run_until_done(asyncio.gather(*batcher.submit([seq(1, 2)])))
    assert not batcher.cost_model.ready
    assert observer.finished[-1][2] is None
    await batcher.close(1)


async def test_coefficients_are_published_only_after_a_refit():
    clock = ManualClock()
    batcher, observer = make_observed(clock, RecordingBackend(clock=clock))
    batcher.start()
    for ids in [(1,), (1, 2)]:
        await clock.run_until_done(asyncio.gather(*batcher.submit([seq(*ids)])))
    assert batcher.cost_model.fits == 0 and observer.cost_models == []
    await batcher.close(1)


async def test_without_a_pad_token_rows_are_padded_with_zeros():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = MicroBatcher("m", backend.infer, BatchLimits(), LIMITS, clock=clock)
    batcher.start()
    await clock.run_until_done(asyncio.gather(*batcher.submit([seq(7), seq(7, 7)])))
    assert backend.batches[0].input_ids.tolist() == [[7, 0], [7, 7]]
    await batcher.close(1)


async def test_the_collector_task_is_named_after_the_model():
    batcher = make(RecordingBackend(), ManualClock())
    # What a task dump (asyncio, aiomonitor, py-spy) shows for the batcher's loop.
    assert "batcher:m" in {task.get_name() for task in asyncio.all_tasks()}
    await batcher.close(0)


async def test_a_cancelled_request_leaves_the_reported_queue_depth():
    clock = ManualClock()
    batcher, observer = make_observed(clock, RecordingBackend())  # not started: all queued
    batcher.submit([seq(1)])
    (gone,) = batcher.submit([seq(2)])
    assert observer.depths == [1, 2]
    gone.cancel()
    await settle()
    assert observer.depths == [1, 2, 1]
    assert observer.rejections == ["cancelled"]
    await batcher.close(0)


async def test_a_dispatched_request_s_answer_reports_no_queue_depth_again():
    clock = ManualClock()
    batcher, observer = make_observed(clock, RecordingBackend(clock=clock))
    batcher.start()
    (answer,) = batcher.submit([seq(1)])
    await clock.run_until_done(answer)
    assert observer.depths == [1, 0]  # queued, then dispatched; its answer left no queue
    await batcher.close(0)


class RunnerBackend:
    """A backend with `runners` of its own: a batch handed over while all run waits inside it,
    as ONNX Runtime's worker pool does (`queues_batches`); each batch takes `seconds`."""

    def __init__(self, clock: ManualClock, runners: int, seconds: float | None) -> None:
        self.clock = clock
        self.seconds = seconds  # None: as many seconds as the batch has padded tokens
        self.handed: list[float] = []  # clock time of each hand-over
        self._runners = asyncio.Semaphore(runners)

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        self.handed.append(self.clock.time())
        async with self._runners:
            await self.clock.sleep(self.seconds or float(batch.padded_tokens))
        return {"total": np.ones((batch.size, 1), dtype=np.float32)}


@pytest.mark.parametrize("prepared", [0, 1])
async def test_a_prepared_batch_waits_in_the_backend_and_is_timed_from_its_runner(prepared):
    clock = ManualClock()
    backend = RunnerBackend(clock, runners=1, seconds=1.0)
    batcher, observer = make_observed(
        clock, backend, max_batch_size=1, max_concurrent_batches=1, prepared_batches=prepared
    )
    batcher.start()
    futures = batcher.submit([seq(1), seq(2), seq(3)])
    await settle()
    # With one prepared, the second batch is already inside the backend behind the first.
    assert backend.handed == [1000.0] + [1000.0] * prepared
    assert batcher.queue_depth == 2 - prepared
    await clock.run_until_done(asyncio.gather(*futures))
    # Each batch ran for 1 s on the runner: the wait for it is not its cost.
    assert [seconds for seconds, _, _ in observer.finished] == [1.0, 1.0, 1.0]
    await batcher.close(1)


async def test_batches_on_two_runners_are_each_timed_by_their_own_run():
    # Runners 2, one batch ahead; a batch of L tokens runs L seconds. A (1) and B (2) start at 0;
    # C (3) waits and starts when A ends (1); D (4) waits and starts when B ends (2). Each is
    # timed by its own run, however the runners free in turn.
    clock = ManualClock()
    backend = RunnerBackend(clock, runners=2, seconds=None)
    batcher, observer = make_observed(
        clock, backend, max_batch_size=1, max_concurrent_batches=2, prepared_batches=1
    )
    batcher.start()
    futures = [f for length in (1, 2, 3, 4) for f in batcher.submit([seq(*range(1, length + 1))])]
    # At 4.5 s C is done and D runs until 6: E (3) starts on the free runner at once, and D's
    # end (during E) must not be taken for E's start.
    await clock.advance(4.5)
    futures += batcher.submit([seq(1, 2, 3)])
    await clock.run_until_done(asyncio.gather(*futures), step_s=0.5)
    assert backend.handed == [1000.0, 1000.0, 1000.0, 1001.0, 1004.5]
    assert [seconds for seconds, _, _ in observer.finished] == [1.0, 2.0, 3.0, 4.0, 3.0]
    await batcher.close(1)
