"""What the batcher's parts share: the clock they read, the infer call, and the state they hold.

MicroBatcher (batcher.py) is assembled from the parts: admission (whether a request may wait),
collection (when a batch closes and what it holds) and dispatch (running it, scattering rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from ferry.batcher.cost_model import BatchCostModel
from ferry.batcher.observer import BatchObserver
from ferry.batcher.padding import PaddedBatch
from ferry.batcher.policy import BatchLimits
from ferry.batcher.request import QueuedRequest, SequenceLimits

InferFn = Callable[[PaddedBatch], Awaitable[dict[str, np.ndarray]]]
Result = dict[str, np.ndarray]


class Clock(Protocol):
    """Where the batcher reads the time and schedules its waits; the event loop is one.

    Tests pass a manual clock and advance it instead of sleeping.
    """

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Any: ...


class BatcherState:
    """The attributes MicroBatcher.__init__ sets and its parts read."""

    name: str
    limits: BatchLimits
    sequence_limits: SequenceLimits
    cost_model: BatchCostModel
    _infer: InferFn
    _sequence_outputs: frozenset[str]
    _pad_token_id: int
    _infer_timeout_s: float | None
    _observer: BatchObserver
    _clock: Clock | None
    _pending: dict[int, QueuedRequest]
    # Queued requests per priority: a priority is a key only while some are queued.
    _queued_count: dict[int, int]
    _arrival: asyncio.Event
    _slots: asyncio.Semaphore
    _running: set[asyncio.Task]
    _recent_batch_s: float
    # Seconds a batch really took per second admission priced its members at (recent batches):
    # what the shares leave out (padding to a neighbour's length, a cut short of the cheapest
    # size, other work on the cores) makes it > 1, and admission scales its prediction by it.
    _pace: float
    # Predicted seconds of queued work per priority (admission's running sums).
    _queued_work: dict[int, float]
    _published_fits: int

    def _cost_model_refitted(self) -> None:
        """Called after each refit of the cost model (admission prices the queue again)."""

    def _running_clock(self) -> Clock:
        return self._clock or asyncio.get_running_loop()

    def _enqueue(self, request: QueuedRequest) -> None:
        self._pending[id(request)] = request
        priority = request.priority
        self._queued_count[priority] = self._queued_count.get(priority, 0) + 1
        self._queued_work[priority] = self._queued_work.get(priority, 0.0) + request.cost_s

    def _dequeue(self, request: QueuedRequest) -> bool:
        """Take `request` out of the queue; False if it was not there (already dispatched)."""
        if self._pending.pop(id(request), None) is None:
            return False
        priority = request.priority
        self._queued_count[priority] -= 1
        if self._queued_count[priority]:
            self._queued_work[priority] -= request.cost_s
        else:  # exactly 0, not a float remainder, once a priority's queue is empty
            del self._queued_count[priority], self._queued_work[priority]
        return True
