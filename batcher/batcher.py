"""The micro-batcher: requests in, one future each out, resolved by batches run on a backend.

Every future handed out by `submit` resolves exactly once: with a result, a batcher error, or
cancellation by its caller. It is composed of parts that own their state: the queue (queue.py:
who waits, their work per priority), admission (admission.py: may a request wait?), collection
(collection.py: when does a batch close, what does it take) and dispatch (dispatch.py: the batch
slots, running a batch, scattering its rows); all of them read one learned cost model. This
class wires them, holds the public API and the per-request bookkeeping (deadlines, cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from ferry.batcher import tracing
from ferry.batcher.admission import Admission
from ferry.batcher.collection import Collection
from ferry.batcher.cost_model import BatchCostModel
from ferry.batcher.deadlines import Deadlines
from ferry.batcher.dispatch import Dispatch
from ferry.batcher.errors import (
    BatchAbandoned,
    BatcherClosed,
    BatcherError,
    DeadlineExceeded,
)
from ferry.batcher.observer import BatchObserver, NullObserver
from ferry.batcher.packing import Packing, TokenPacking
from ferry.batcher.padding import PaddedBatch
from ferry.batcher.policy import BatchLimits
from ferry.batcher.queue import RequestQueue
from ferry.batcher.request import QueuedRequest, SequenceLimits, TokenSequence
from ferry.batcher.tensor_padding import TensorRows
from ferry.batcher.types import Clock, InferFn, Result, clock_or_loop

logger = logging.getLogger(__name__)


class MicroBatcher:
    def __init__(
        self,
        name: str,
        infer: InferFn,
        limits: BatchLimits,
        sequence_limits: SequenceLimits | None,
        *,
        sequence_outputs: frozenset[str] = frozenset(),
        pad_token_id: int = 0,
        packing: Packing | None = None,
        default_timeout_s: float | None = None,
        infer_timeout_s: float | None = None,
        observer: BatchObserver | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self.sequence_limits = sequence_limits
        self._default_timeout_s = default_timeout_s
        self._observer = observer or NullObserver()
        self._deadlines = Deadlines(self._expire)
        self._clock = clock  # None: the running loop's own time
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        # Always learning (and exported); steering batches only under a latency objective.
        self.cost_model = BatchCostModel()
        self.queue = RequestQueue()
        self.dispatch = Dispatch(
            name,
            infer,
            self.queue,
            self.cost_model,
            self._observer,
            slots=limits.max_concurrent_batches,
            prepared=limits.prepared_batches,
            # Token sequences unless told otherwise (tensors of any shape: TensorPacking).
            packing=packing or TokenPacking(pad_token_id, sequence_outputs),
            infer_timeout_s=infer_timeout_s,
            clock=clock,
            refitted=self._cost_model_refitted,
        )
        self.admission = Admission(
            limits, self.queue, self.cost_model, self.dispatch, self._observer
        )
        self.collection = Collection(
            limits, self.queue, self.cost_model, self.dispatch, self._observer, clock
        )
        self._infer = infer

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(
                self._collect_forever(), name=f"batcher:{self.name}"
            )
            self._loop_task.add_done_callback(self._log_crash)

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def running_batches(self) -> int:
        return len(self.dispatch.running)

    def request_cost_s(self, length: int) -> float:
        """What admission prices a request of `length` tokens at (admission.py)."""
        return self.admission.request_cost_s(length)

    def predicted_wait_s(self, priority: int = 0, extra_s: float = 0.0) -> float | None:
        """When a request of `priority` costing `extra_s` would finish if queued now."""
        return self.admission.predicted_wait_s(priority, extra_s)

    def submit(
        self,
        sequences: Sequence[TokenSequence | TensorRows],
        timeout_s: float | None = None,
        outputs: frozenset[str] | None = None,
        priority: int = 0,
    ) -> list[asyncio.Future[Result]]:
        """Queue all `sequences` or none of them; one future per sequence.

        `priority` has vLLM's meaning: queued requests of a lower number are served first;
        within one priority the fairness window holds (collection.py).

        `outputs` names what the caller will read (None: every output); a batch fetches only the
        union of what its members asked for. Raises QueueFull
        (also when the queue ahead would make the request miss its deadline) or BatcherClosed
        at once.
        """
        if self._closed:
            self._observer.rejected("closed")
            raise BatcherClosed(f"model {self.name!r} is shutting down")
        # Validated once, by the server (encoder_validation.py): asserted, not checked again.
        limits = self.sequence_limits
        assert limits is None or all(
            limits.admits(s) for s in sequences if isinstance(s, TokenSequence)
        ), "unvalidated sequences"
        loop = asyncio.get_running_loop()
        clock = self._clock or loop
        now = clock.time()
        timeout_s = self._default_timeout_s if timeout_s is None else timeout_s
        deadline = None if timeout_s is None else now + timeout_s
        costs = [self.admission.request_cost_s(seq.length) for seq in sequences]
        tracer = tracing.current.get()
        with contextlib.nullcontext() if tracer is None else tracer.admission():
            requests = sum(getattr(seq, "requests", 1) for seq in sequences)
            self.admission.admit(requests, sum(costs), now, deadline, priority)
        futures = []
        for seq, cost_s in zip(sequences, costs, strict=True):
            request = QueuedRequest(
                seq,
                loop.create_future(),
                enqueued_at=now,
                deadline=deadline,
                outputs=outputs,
                priority=priority,
                cost_s=cost_s,
                trace=None if tracer is None else tracer.queued(),
            )
            if deadline is not None:
                request.expiry = self._deadlines.add(request, deadline, clock)
            request.future.add_done_callback(partial(self._forget_done, request))
            self.queue.add(request)
            futures.append(request.future)
        self._observer.queue_depth(len(self.queue))
        self.queue.arrived()
        return futures

    async def calibrate(self, shapes: Sequence[tuple[int, int]] | None = None) -> None:
        """Seed the cost model with warm-up batches of known shapes (before serving)."""
        limits = self.limits
        clock = clock_or_loop(self._clock)
        assert self.sequence_limits is not None, "calibrated by token shapes"
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

    async def close(self, drain_timeout_s: float) -> None:
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
        await self.dispatch.stop()
        for request in list(self.queue):
            request.fail(BatchAbandoned(f"model {self.name!r} stopped"))
        self._deadlines.stop()

    async def _collect_forever(self) -> None:
        while True:
            await self.dispatch.acquire_slot()
            try:
                batch = await self.collection.next_batch()
            except BaseException:
                self.dispatch.release_slot()
                raise
            self.dispatch.start(batch)

    def _cost_model_refitted(self) -> None:
        self.admission.reprice()

    async def _drained(self) -> None:
        while self.queue or self.dispatch.running:
            await asyncio.sleep(0.01)

    def _expire(self, request: QueuedRequest) -> None:
        if not request.future.done():
            self._observer.rejected("deadline")
            request.future.set_exception(DeadlineExceeded("the request's deadline passed"))

    def _forget_done(self, request: QueuedRequest, _: asyncio.Future[Any]) -> None:
        self._forget(request)

    def _forget(self, request: QueuedRequest) -> None:
        if request.expiry is not None:
            self._deadlines.drop(request.expiry)
        if request.trace is not None:
            request.trace.left()
        if self.queue.remove(request):
            self._observer.queue_depth(len(self.queue))
        if request.future.cancelled():
            self._observer.rejected("cancelled")

    def _log_crash(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.critical("model %s: batcher loop died", self.name, exc_info=task.exception())


__all__ = ["BatcherError", "Clock", "InferFn", "MicroBatcher", "Result"]
