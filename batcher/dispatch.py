"""Dispatch: run a closed batch on the backend and scatter its rows to the members' futures.

A member that makes the batch fail is found by running each member alone; a hung backend fails
its batch after the inference timeout; no future is left unresolved whatever path is taken.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from ferry.batcher.errors import (
    BatchAbandoned,
    BatchWideFailure,
    InferenceFailed,
    InferenceTimedOut,
)
from ferry.batcher.padding import PaddedBatch, pad_batch, unpad_outputs
from ferry.batcher.request import QueuedRequest
from ferry.batcher.state import BatcherState, Result

logger = logging.getLogger(__name__)


class Dispatch(BatcherState):
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
            batch[0].priority,  # a batch holds one priority (collection.py)
        )
        try:
            rows = await self._infer_rows(padded, sum(r.cost_s for r in batch))
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

    async def _infer_rows(self, padded: PaddedBatch, priced_s: float) -> list[Result]:
        """Run the batch; `priced_s` is what admission priced its members at (their shares)."""
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
                self.cost_model.observe(padded.size, padded.padded_length, elapsed)
                if priced_s > 0:
                    self._pace = 0.8 * self._pace + 0.2 * elapsed / priced_s
            self._observer.batch_finished(
                elapsed, failed, predicted_s if self.cost_model.ready else None
            )
            if self.cost_model.fits != self._published_fits:
                # Only after a refit: the coefficients change every few batches, not every one.
                self._published_fits = self.cost_model.fits
                self._observer.cost_model(self.cost_model.as_dict())
                self._cost_model_refitted()

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
