"""The micro-batcher: requests in, one future each out, resolved by batches run on a backend.

Every future handed out by `submit` resolves exactly once: with a result, a batcher error, or
cancellation by its caller. The work is split by job: admission.py (may a request wait?),
collection.py (when does a batch close, what does it take), dispatch.py (run it, scatter the
rows); this class holds the state, the public API and the per-request bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import numpy as np

from ferry.batcher.admission import Admission
from ferry.batcher.collection import Collection
from ferry.batcher.cost_model import BatchCostModel
from ferry.batcher.dispatch import Dispatch, _resolve_error
from ferry.batcher.errors import (
    BatchAbandoned,
    BatcherClosed,
    BatcherError,
    DeadlineExceeded,
    InvalidInput,
    QueueFull,
)
from ferry.batcher.observer import BatchObserver, NullObserver
from ferry.batcher.padding import PaddedBatch
from ferry.batcher.policy import BatchLimits
from ferry.batcher.request import QueuedRequest, SequenceLimits, TokenSequence
from ferry.batcher.state import Clock, InferFn, Result

logger = logging.getLogger(__name__)


class MicroBatcher(Admission, Collection, Dispatch):
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
        self._queued_count: dict[int, int] = {}
        self._arrival = asyncio.Event()
        self._slots = asyncio.Semaphore(limits.max_concurrent_batches)
        self._running: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._closed = False
        self._recent_batch_s = 0.05
        self._pace = 1.0
        self._queued_work: dict[int, float] = {}
        # Always learning (and exported); steering batches only under a latency objective.
        self.cost_model = BatchCostModel()
        self._published_fits = 0

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
        priority: int = 0,
    ) -> list[asyncio.Future[Result]]:
        """Queue all `sequences` or none of them; one future per sequence.

        `priority` has vLLM's meaning: queued requests of a lower number are served first;
        within one priority the fairness window holds (collection.py).

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
        self._admit_by_predicted_wait(sequences, now, deadline, priority)
        futures = []
        for seq in sequences:
            request = QueuedRequest(
                seq,
                loop.create_future(),
                enqueued_at=now,
                deadline=deadline,
                outputs=outputs,
                priority=priority,
                cost_s=self.request_cost_s(seq.length),
            )
            if deadline is not None:
                request.expiry = clock.call_at(deadline, self._expire, request)
            request.future.add_done_callback(lambda fut, r=request: self._forget(r))
            self._enqueue(request)
            futures.append(request.future)
        self._observer.queue_depth(len(self._pending))
        self._arrival.set()
        return futures

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
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        for request in list(self._pending.values()):
            _resolve_error(request, BatchAbandoned(f"model {self.name!r} stopped"))

    async def _drained(self) -> None:
        while self._pending or self._running:
            await asyncio.sleep(0.01)

    def _expire(self, request: QueuedRequest) -> None:
        if not request.future.done():
            self._observer.rejected("deadline")
            request.future.set_exception(DeadlineExceeded("the request's deadline passed"))

    def _forget(self, request: QueuedRequest) -> None:
        if request.expiry is not None:
            request.expiry.cancel()
        if self._dequeue(request):
            self._observer.queue_depth(len(self._pending))
        if request.future.cancelled():
            self._observer.rejected("cancelled")

    def _log_crash(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.critical("model %s: batcher loop died", self.name, exc_info=task.exception())


__all__ = ["BatcherError", "Clock", "InferFn", "MicroBatcher", "Result"]
