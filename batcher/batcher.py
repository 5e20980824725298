"""The micro-batcher loop: collect requests, close a batch, dispatch it, scatter the results.

Shaped after Ray Serve's `wait_for_batch` (block on the first request, wait only the rest of the
delay window) and TGI's queue (bounded, drop entries whose caller has gone). Every future handed
out by `submit` resolves exactly once: with a result, a batcher error, or cancellation by its
caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from ferry.batcher.cost_model import BatchCostModel
from ferry.batcher.errors import (
    BatchAbandoned,
    BatcherClosed,
    BatcherError,
    BatchWideFailure,
    DeadlineExceeded,
    InferenceFailed,
    InferenceTimedOut,
    InvalidInput,
    QueueFull,
)
from ferry.batcher.observer import BatchObserver, NullObserver
from ferry.batcher.padding import PaddedBatch, pad_batch, unpad_outputs
from ferry.batcher.policy import BatchLimits, batch_is_full, best_prefix, growth_order
from ferry.batcher.request import QueuedRequest, SequenceLimits, TokenSequence

logger = logging.getLogger(__name__)

# How far back finished batches count towards the queue's drain rate.
RATE_WINDOW_S = 2.0
# Predictions on a shared machine err both ways: admit only what fits with this much to spare.
ADMISSION_MARGIN = 1.5

InferFn = Callable[[PaddedBatch], Awaitable[dict[str, np.ndarray]]]
Result = dict[str, np.ndarray]


class Clock(Protocol):
    """Where the batcher reads the time and schedules its waits; the event loop is one.

    Tests pass a manual clock and advance it instead of sleeping.
    """

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Any: ...


class MicroBatcher:
    def __init__(
        self,
        name: str,
        infer: InferFn,
        limits: BatchLimits,
        sequence_limits: SequenceLimits,
        *,
        sequence_outputs: frozenset[str] = frozenset(),
        pad_token_id: int = 0,
        default_timeout_s: float | None = None,
        infer_timeout_s: float | None = None,
        observer: BatchObserver | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self._infer = infer
        self.limits = limits
        self.sequence_limits = sequence_limits
        self._sequence_outputs = sequence_outputs
        self._pad_token_id = pad_token_id
        self._default_timeout_s = default_timeout_s
        self._infer_timeout_s = infer_timeout_s
        self._observer = observer or NullObserver()
        self._clock = clock  # None: the running loop's own time
        # Insertion-ordered, so iteration is arrival order and removal is O(1).
        self._pending: dict[int, QueuedRequest] = {}
        self._pending_tokens = 0
        self._arrival = asyncio.Event()
        self._slots = asyncio.Semaphore(limits.max_concurrent_batches)
        self._running: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._closed = False
        self._recent_batch_s = 0.05
        # (finish time, requests) of recent batches: the queue's real drain rate under load.
        self._completions: deque[tuple[float, int]] = deque()
        # Always learning (and exported); steering batches only under a latency objective.
        self.cost_model = BatchCostModel()
        self._published_fits = 0

    # -- public API -------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(
                self._collect_forever(), name=f"batcher:{self.name}"
            )
            self._loop_task.add_done_callback(self._log_crash)

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def running_batches(self) -> int:
        return len(self._running)

    def submit(
        self,
        sequences: Sequence[TokenSequence],
        timeout_s: float | None = None,
        outputs: frozenset[str] | None = None,
    ) -> list[asyncio.Future[Result]]:
        """Queue all `sequences` or none of them; one future per sequence.

        `outputs` names what the caller will read (None: every output); a batch fetches only the
        union of what its members asked for. Raises InvalidInput (naming the field), QueueFull
        (also when the queue ahead would make the request miss its deadline) or BatcherClosed
        at once.
        """
        if self._closed:
            self._observer.rejected("closed")
            raise BatcherClosed(f"model {self.name!r} is shutting down")
        for index, seq in enumerate(sequences):
            try:
                self.sequence_limits.validate(seq)
            except InvalidInput as exc:
                self._observer.rejected("invalid")
                # `input_ids[1]`: the one param format of every route (README, Errors).
                field = f"{exc.field}[{index}]" if len(sequences) > 1 else exc.field
                raise InvalidInput(field, exc.message) from None
        if len(self._pending) + len(sequences) > self.limits.max_queue_size:
            self._observer.rejected("queue_full")
            raise QueueFull(retry_after_s=self._retry_after_s())
        loop = asyncio.get_running_loop()
        clock = self._clock or loop
        now = clock.time()
        timeout_s = self._default_timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout_s is None else now + timeout_s
        self._admit_by_predicted_wait(sequences, now, deadline)
        futures = []
        for seq in sequences:
            request = QueuedRequest(
                seq, loop.create_future(), enqueued_at=now, deadline=deadline, outputs=outputs
            )
            if deadline is not None:
                request.expiry = clock.call_at(deadline, self._expire, request)
            request.future.add_done_callback(lambda fut, r=request: self._forget(r))
            self._pending[id(request)] = request
            self._pending_tokens += seq.length
            futures.append(request.future)
        self._observer.queue_depth(len(self._pending))
        self._arrival.set()
        return futures

    def predicted_wait_s(self, extra: int = 0, extra_tokens: int = 0) -> float | None:
        """When `extra` more requests would finish if queued now (None: nothing to go by yet).

        Under load, from the rate at which requests have been finishing over the last
        RATE_WINDOW_S: it already holds the machine's real speed (other batches at once, other
        processes). Otherwise from the cost model: the queue in full batches of its mean
        length, `max_concurrent_batches` at a time, after the batches running now.
        """
        queued = len(self._pending) + extra
        if queued == 0:
            return 0.0
        rate = self._completion_rate()
        if rate is not None:
            return queued / rate
        if not self.cost_model.ready:
            return None
        mean_length = max(1, round((self._pending_tokens + extra_tokens) / queued))
        size = min(self.limits.max_batch_size, max(1, self.limits.max_batch_tokens // mean_length))
        batches = -(-queued // size)
        rounds = -(-batches // self.limits.max_concurrent_batches)
        per_batch = self.cost_model.predict(min(size, queued), mean_length)
        running = self._recent_batch_s if self._running else 0.0
        return running + rounds * per_batch

    def _completion_rate(self) -> float | None:
        """Requests finished per second over the recent window, if batches kept finishing."""
        now = self._running_clock().time()
        while self._completions and self._completions[0][0] < now - RATE_WINDOW_S:
            self._completions.popleft()
        if len(self._completions) < 2:
            return None
        span = now - self._completions[0][0]
        done = sum(count for _, count in list(self._completions)[1:])
        return done / span if span > 0 and done else None

    def _admit_by_predicted_wait(
        self, sequences: Sequence[TokenSequence], now: float, deadline: float | None
    ) -> None:
        """Refuse now (429) what the queue ahead would make finish after its deadline (504).

        Only the deadline counts: a latency objective is a target that steers batch sizes, and
        refusing at it would turn every burst into 429s.
        """
        if deadline is None or not self._pending:
            return
        tokens = sum(seq.length for seq in sequences)
        wait = self.predicted_wait_s(len(sequences), tokens)
        if wait is not None and now + wait * ADMISSION_MARGIN > deadline:
            self._observer.rejected("predicted_late")
            raise QueueFull(
                retry_after_s=max(1.0, wait),
                message=f"the queue ahead would take {wait:.1f}s, past this request's deadline",
            )

    async def calibrate(self, shapes: Sequence[tuple[int, int]] | None = None) -> None:
        """Seed the cost model with warm-up batches of known shapes (before serving)."""
        limits = self.limits
        clock = self._running_clock()
        longest = self.sequence_limits.max_length
        shapes = shapes or [
            (n, length)
            for n in sorted({1, max(1, limits.max_batch_size // 4), limits.max_batch_size})
            for length in sorted({min(16, longest), min(64, longest), longest // 2 or 1})
            if n * length <= max(limits.max_batch_tokens, length)
        ]
        for n, length in shapes:
            ids = np.ones((n, length), dtype=np.int64)
            padded = PaddedBatch(ids, np.ones_like(ids), (length,) * n)
            started = clock.time()
            await self._infer(padded)
            self.cost_model.observe(n, length, clock.time() - started)
        if len(shapes) >= 4:
            self.cost_model.refit()

    async def close(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new work, let queued and running batches finish, then stop.

        Whatever has not finished by the drain timeout fails with BatchAbandoned.
        """
        self._closed = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained(), drain_timeout_s)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        for request in list(self._pending.values()):
            _resolve_error(request, BatchAbandoned(f"model {self.name!r} stopped"))

    # -- collection -------------------------------------------------------------------------

    async def _drained(self) -> None:
        while self._pending or self._running:
            await asyncio.sleep(0.01)

    async def _collect_forever(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            task = asyncio.create_task(self._dispatch(batch))
            self._running.add(task)
            task.add_done_callback(self._batch_done)

    async def _next_batch(self) -> list[QueuedRequest]:
        clock = self._running_clock()
        while True:
            if not self._pending:
                self._arrival.clear()
                await self._arrival.wait()
                continue
            queued = list(self._pending.values())
            order = growth_order(queued, self.limits)
            wait_s = self._wait_for_more_s(queued, order, clock.time())
            if wait_s > 0:
                self._arrival.clear()
                # An arrival or the end of the wait, whichever comes first, wakes the loop.
                wake = clock.call_at(clock.time() + wait_s, self._arrival.set)
                try:
                    await self._arrival.wait()
                finally:
                    wake.cancel()
                continue
            batch = [queued[i] for i in order[: self._batch_count(queued, order, clock.time())]]
            for request in batch:
                del self._pending[id(request)]
                self._pending_tokens -= request.length
            self._observer.queue_depth(len(self._pending))
            return batch

    def _steered(self) -> bool:
        return self.limits.latency_objective_s is not None and self.cost_model.ready

    def _wait_for_more_s(self, queued: list[QueuedRequest], order: list[int], now: float) -> float:
        """How long to wait for more requests before closing the batch (0: close it now)."""
        if (not self._running and self.limits.dispatch_when_idle) or batch_is_full(
            queued, self.limits
        ):
            return 0.0
        oldest = queued[0]
        if self._steered():
            # Wait while the oldest request could still finish a full batch within half its
            # objective: the other half is for the p99 tail.
            longest = max(queued[i].length for i in order)
            full_cost = self.cost_model.predict(self.limits.max_batch_size, longest)
            objective = self.limits.latency_objective_s or 0.0
            slack = oldest.enqueued_at + objective / 2 - full_cost - now
            return max(0.0, min(slack, objective / 4))
        return max(0.0, oldest.enqueued_at + self.limits.max_queue_delay_s - now)

    def _batch_count(self, queued: list[QueuedRequest], order: list[int], now: float) -> int:
        """How many of the growth order to take: all of it, or what the cost model finds best."""
        if not (self.limits.cost_model_batching and self.cost_model.ready):
            return len(order)
        oldest = queued[0]
        finish_by = oldest.deadline
        if self.limits.latency_objective_s is not None:
            objective_end = oldest.enqueued_at + self.limits.latency_objective_s
            finish_by = objective_end if finish_by is None else min(finish_by, objective_end)
        lengths = [queued[i].length for i in order]
        budget = None if finish_by is None else finish_by - now
        return best_prefix(lengths, self.cost_model.predict, budget)

    # -- dispatch ---------------------------------------------------------------------------

    async def _dispatch(self, batch: list[QueuedRequest]) -> None:
        try:
            live = [r for r in batch if not r.future.done()]
            if live:
                await self._run_batch(live)
        except asyncio.CancelledError:
            for request in batch:
                _resolve_error(request, BatchAbandoned(f"model {self.name!r} stopped"))
            raise
        finally:
            # A future must never hang: whatever path we left by, nobody stays unresolved.
            for request in batch:
                _resolve_error(request, InferenceFailed("the batch ended without a result"))

    async def _run_batch(self, batch: list[QueuedRequest]) -> None:
        wanted = _wanted_outputs(batch)
        padded = pad_batch([r.sequence for r in batch], self._pad_token_id, wanted)
        if not self._pending and len(self._running) <= 1:  # this batch's own task only
            padded = replace(padded, runs_alone=True)
        now = self._running_clock().time()
        self._observer.batch_formed(
            padded.size,
            padded.real_tokens,
            padded.padded_tokens,
            [now - r.enqueued_at for r in batch],
        )
        try:
            rows = await self._infer_rows(padded)
        except BatchWideFailure as exc:
            for request in batch:
                _resolve_error(request, exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                logger.warning("model %s: inference failed: %s", self.name, exc)
                _resolve_error(batch[0], InferenceFailed(f"inference failed: {exc}"))
                return
            # One bad member must not fail the rest: find it by running each member alone.
            logger.warning(
                "model %s: batch of %d failed (%s); retrying alone", self.name, len(batch), exc
            )
            for request in batch:
                if not request.future.done():
                    await self._run_batch([request])
            return
        for request, row in zip(batch, rows, strict=True):
            if not request.future.done():
                request.future.set_result(row)

    async def _infer_rows(self, padded: PaddedBatch) -> list[Result]:
        predicted_s = self.cost_model.predict(padded.size, padded.padded_length)
        clock = self._running_clock()
        started = clock.time()
        failed = True
        try:
            outputs = await self._infer_within_timeout(padded)
            for name, value in outputs.items():
                if value.shape[0] != padded.size:
                    raise InferenceFailed(
                        f"output {name!r} has {value.shape[0]} rows for a batch of {padded.size}"
                    )
            failed = False
            return unpad_outputs(outputs, padded.lengths, self._sequence_outputs, padded.outputs)
        finally:
            elapsed = clock.time() - started
            self._recent_batch_s = 0.8 * self._recent_batch_s + 0.2 * elapsed
            if not failed:
                self._completions.append((clock.time(), padded.size))
                self.cost_model.observe(padded.size, padded.padded_length, elapsed)
            self._observer.batch_finished(
                elapsed, failed, predicted_s if self.cost_model.ready else None
            )
            if self.cost_model.fits != self._published_fits:
                # Only after a refit: the coefficients change every few batches, not every one.
                self._published_fits = self.cost_model.fits
                self._observer.cost_model(self.cost_model.as_dict())

    async def _infer_within_timeout(self, padded: PaddedBatch) -> Result:
        """A hung backend fails its batch (504) instead of holding its callers forever."""
        if self._infer_timeout_s is None:
            return await self._infer(padded)
        clock = self._running_clock()
        task = asyncio.ensure_future(self._infer(padded))
        timed_out = False

        def expire() -> None:
            nonlocal timed_out
            timed_out = True
            task.cancel()

        timer = clock.call_at(clock.time() + self._infer_timeout_s, expire)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not timed_out or (current is not None and current.cancelling()):
                raise
            raise InferenceTimedOut(
                f"the backend did not answer within {self._infer_timeout_s}s"
            ) from None
        finally:
            timer.cancel()

    # -- bookkeeping ------------------------------------------------------------------------

    def _running_clock(self) -> Clock:
        return self._clock or asyncio.get_running_loop()

    def _expire(self, request: QueuedRequest) -> None:
        if not request.future.done():
            self._observer.rejected("deadline")
            request.future.set_exception(DeadlineExceeded("the request's deadline passed"))

    def _forget(self, request: QueuedRequest) -> None:
        if request.expiry is not None:
            request.expiry.cancel()
        if self._pending.pop(id(request), None) is not None:
            self._pending_tokens -= request.length
            self._observer.queue_depth(len(self._pending))
        if request.future.cancelled():
            self._observer.rejected("cancelled")

    def _batch_done(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            logger.error("model %s: batch dispatch crashed", self.name, exc_info=task.exception())

    def _log_crash(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.critical("model %s: batcher loop died", self.name, exc_info=task.exception())

    def _retry_after_s(self) -> float:
        """How long the queue ahead takes to drain at the recent batch rate (at least 1 s)."""
        batches_ahead = len(self._pending) / self.limits.max_batch_size
        per_slot = batches_ahead / self.limits.max_concurrent_batches
        return max(1.0, per_slot * self._recent_batch_s)


def _wanted_outputs(batch: list[QueuedRequest]) -> tuple[str, ...] | None:
    """The union of what the members asked for, in a stable order; None if one wants all."""
    wanted: set[str] = set()
    for request in batch:
        if request.outputs is None:
            return None
        wanted |= request.outputs
    return tuple(sorted(wanted))


def _resolve_error(request: QueuedRequest, error: BaseException) -> None:
    if not request.future.done():
        request.future.set_exception(error)


__all__ = ["BatcherError", "MicroBatcher"]
