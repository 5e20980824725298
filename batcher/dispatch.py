"""Dispatch: run a closed batch on the backend and scatter its rows to the members' futures.

Owns the concurrent batch slots and the running batches, and what they teach: the recent batch
time and the pace (seconds a batch really took per second admission priced its members at).
A member that makes the batch fail is found by running each member alone; a hung backend fails
its batch after the inference timeout; no future is left unresolved whatever path is taken.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ferry.batcher.cost_model import BatchCostModel
from ferry.batcher.errors import (
    BatchAbandoned,
    BatchWideFailure,
    InferenceFailed,
    InferenceTimedOut,
)
from ferry.batcher.observer import BatchObserver, FormedBatch
from ferry.batcher.packing import Packing
from ferry.batcher.queue import RequestQueue
from ferry.batcher.request import QueuedRequest
from ferry.batcher.tracing import BatchSpan, batch_span
from ferry.batcher.types import Batch, Clock, InferFn, Result, clock_or_loop

logger = logging.getLogger(__name__)


class Dispatch:
    def __init__(
        self,
        name: str,
        infer: InferFn,
        queue: RequestQueue,
        cost_model: BatchCostModel,
        observer: BatchObserver,
        *,
        slots: int,
        prepared: int,
        packing: Packing,
        infer_timeout_s: float | None,
        clock: Clock | None,
        refitted: Callable[[], None],
    ) -> None:
        self.name = name
        self._infer = infer
        self._queue = queue
        self._cost_model = cost_model
        self._observer = observer
        self._packing = packing
        self._infer_timeout_s = infer_timeout_s
        self._clock = clock
        self._refitted = refitted  # after each refit of the cost model
        # A slot per runner, and per batch that may wait inside the backend for a runner.
        self._slots = asyncio.Semaphore(slots + prepared)
        self._runners = slots
        self._on_backend = 0
        # The start times of batches waiting inside the backend for a runner, in the order the
        # backend takes them: the one that frees a runner starts the first of them.
        self._waiting_starts: deque[list[float]] = deque()
        self.running: set[asyncio.Task[None]] = set()
        self.recent_batch_s = 0.05
        # Seconds a batch really took per second admission priced its members at (recent
        # batches): what the shares leave out (padding to a neighbour's length, a cut short of
        # the cheapest size, other work on the cores) makes it > 1.
        self.pace = 1.0
        # Its terms: moving averages of the seconds recent batches took and were priced at.
        self._took_s = 0.0
        self._priced_s = 0.0
        self._published_fits = 0

    async def acquire_slot(self) -> None:
        await self._slots.acquire()

    def release_slot(self) -> None:
        self._slots.release()

    def start(self, batch: list[QueuedRequest]) -> None:
        """Run `batch` in a task of its own, on a slot already acquired."""
        task = asyncio.create_task(self._dispatch(batch))
        self.running.add(task)
        task.add_done_callback(self._batch_done)

    async def stop(self) -> None:
        """Cancel the running batches (their members fail with BatchAbandoned)."""
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            logger.error("model %s: batch dispatch crashed", self.name, exc_info=task.exception())

    async def _dispatch(self, batch: list[QueuedRequest]) -> None:
        try:
            live = [r for r in batch if not r.future.done()]
            if live:
                await self._run_batch(live)
        except asyncio.CancelledError:
            for request in batch:
                request.fail(BatchAbandoned(f"model {self.name!r} stopped"))
            raise
        finally:
            # A future must never hang: whatever path we left by, nobody stays unresolved.
            for request in batch:
                request.fail(InferenceFailed("the batch ended without a result"))

    async def _run_batch(self, batch: list[QueuedRequest]) -> None:
        with batch_span(self.name, [r.trace for r in batch]) as span:
            await self._run_traced(batch, span)

    async def _run_traced(self, batch: list[QueuedRequest], span: BatchSpan) -> None:
        wanted = _wanted_outputs(batch)
        members = [r.sequence for r in batch]
        if self._packing.off_loop(members):
            padded = await asyncio.to_thread(self._packing.pack, members, wanted)
        else:
            padded = self._packing.pack(members, wanted)
        span.formed(padded.size, padded.padded_length, padded.real_tokens, padded.padded_tokens)
        if not self._queue and len(self.running) <= 1:  # this batch's own task only
            padded = replace(padded, runs_alone=True)
        now = clock_or_loop(self._clock).time()
        self._observer.batch_formed(
            FormedBatch(
                sum(r.requests for r in batch),  # a turn's group counts its clients' requests
                padded.real_tokens,
                padded.padded_tokens,
                [now - r.enqueued_at for r in batch for _ in range(r.requests)],
                batch[0].priority,  # a batch holds one priority (collection.py)
                sum(r.rows for r in batch),
            )
        )
        try:
            with span.backend():
                rows = await self._infer_rows(padded, sum(r.cost_s for r in batch))
        except BatchWideFailure as exc:
            for request in batch:
                request.fail(exc)
            return
        except Exception as exc:
            if len(batch) == 1:
                logger.warning("model %s: inference failed: %s", self.name, exc)
                batch[0].fail(InferenceFailed(f"inference failed: {exc}"))
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

    async def _infer_rows(self, padded: Batch, priced_s: float) -> list[Result]:
        """Run the batch; `priced_s` is what admission priced its members at (their shares)."""
        predicted_s = self._cost_model.predict(padded.size, padded.padded_length)
        clock = clock_or_loop(self._clock)
        started = [clock.time()]  # later, if it waits inside the backend for a runner
        if self._on_backend >= self._runners:
            self._waiting_starts.append(started)
        self._on_backend += 1
        failed = True
        try:
            outputs = await self._infer_within_timeout(padded)
            rows = self._packing.unpack(padded, outputs)
            failed = False
            return rows
        finally:
            self._on_backend -= 1
            now = clock.time()
            if any(start is started for start in self._waiting_starts):
                # It never reached a runner (by identity: another may have started at this time).
                self._waiting_starts = deque(s for s in self._waiting_starts if s is not started)
            elif self._waiting_starts:
                self._waiting_starts.popleft()[0] = now  # its runner takes the next batch
            elapsed = now - started[0]
            if not failed:
                self._cost_model.observe(padded.size, padded.padded_length, elapsed)
                if priced_s > 0:
                    self._learn_pace(elapsed, priced_s)
            self.recent_batch_s = 0.8 * self.recent_batch_s + 0.2 * elapsed
            self._observer.batch_finished(
                elapsed, failed, predicted_s if self._cost_model.ready else None
            )
            if self._cost_model.fits != self._published_fits:
                # Only after a refit: the coefficients change every few batches, not every one.
                self._published_fits = self._cost_model.fits
                self._observer.cost_model(self._cost_model.as_dict())
                self._refitted()

    def _learn_pace(self, elapsed: float, priced_s: float) -> None:
        """The pace as recent seconds taken over recent seconds priced, not a moving average of
        each batch's ratio: a stall adds seconds, it does not multiply them. As a ratio, one
        request alone (priced 32.5 ms) stalled 5 s made the pace 32, and 64 queued requests with
        30 s deadlines were refused as late though they drain in about 1 s. Weighted by what it
        was priced at, that batch counts as the small batch it is; batches all slower by one
        ratio still give that ratio. Before the first priced batch, the pace so far is worth
        a batch of the recent batch time (those that ran before the cost model was ready), so
        that a first priced batch stalled alone counts as small too."""
        if self._priced_s == 0.0:
            self._took_s, self._priced_s = self.pace * self.recent_batch_s, self.recent_batch_s
        self._took_s = 0.8 * self._took_s + 0.2 * elapsed
        self._priced_s = 0.8 * self._priced_s + 0.2 * priced_s
        self.pace = self._took_s / self._priced_s

    async def _infer_within_timeout(self, padded: Batch) -> Result:
        """A hung backend fails its batch (504) instead of holding its callers forever."""
        if self._infer_timeout_s is None:
            return await self._infer(padded)
        clock = clock_or_loop(self._clock)
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


def _wanted_outputs(batch: list[QueuedRequest]) -> tuple[str, ...] | None:
    """The union of what the members asked for, in a stable order; None if one wants all."""
    wanted: set[str] = set()
    for request in batch:
        if request.outputs is None:
            return None
        wanted |= request.outputs
    return tuple(sorted(wanted))
