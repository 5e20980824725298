"""The queue of waiting requests: arrival order, and per priority how many wait and their work.

Insertion-ordered, so iteration is arrival order and removal is O(1). The running sums per
priority are what admission reads on every request; they are kept exact (a priority is a key
only while some of it is queued, so an emptied level leaves no float remainder).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from ferry.batcher.request import QueuedRequest
from ferry.batcher.types import Clock


class RequestQueue:
    def __init__(self) -> None:
        self._pending: dict[int, QueuedRequest] = {}
        self._requests = 0  # the clients' requests queued (a request may stand for several)
        self.count_by_priority: dict[int, int] = {}
        # Predicted seconds of queued work per priority (each request's `cost_s`).
        self.work_by_priority: dict[int, float] = {}
        self._arrival = asyncio.Event()

    def __len__(self) -> int:
        """The clients' requests queued."""
        return self._requests

    def __iter__(self) -> Iterator[QueuedRequest]:
        """Arrival order."""
        return iter(self._pending.values())

    def add(self, request: QueuedRequest) -> None:
        self._pending[id(request)] = request
        self._requests += request.requests
        priority = request.priority
        self.count_by_priority[priority] = self.count_by_priority.get(priority, 0) + 1
        self.work_by_priority[priority] = self.work_by_priority.get(priority, 0.0) + request.cost_s

    def arrived(self) -> None:
        """Wake a collector waiting for requests."""
        self._arrival.set()

    def remove(self, request: QueuedRequest) -> bool:
        """Take `request` out; False if it was not there (already dispatched)."""
        if self._pending.pop(id(request), None) is None:
            return False
        self._requests -= request.requests
        priority = request.priority
        self.count_by_priority[priority] -= 1
        if self.count_by_priority[priority]:
            self.work_by_priority[priority] -= request.cost_s
        else:  # exactly 0, not a float remainder, once a priority's queue is empty
            del self.count_by_priority[priority], self.work_by_priority[priority]
        return True

    def most_urgent(self) -> list[QueuedRequest]:
        """The queued requests of the most urgent (lowest) priority, in arrival order."""
        queued = list(self._pending.values())
        if len(self.count_by_priority) > 1:
            urgent = min(self.count_by_priority)
            return [request for request in queued if request.priority == urgent]
        return queued

    def work_up_to(self, priority: int) -> float:
        """Queued work of `priority` and every more urgent one."""
        return sum(s for p, s in self.work_by_priority.items() if p <= priority)

    def reprice(self, cost_s: Callable[[int], float]) -> None:
        """Price every queued request again by its length (after the cost model changed)."""
        work: dict[int, float] = {}
        for request in self._pending.values():
            request.cost_s = cost_s(request.length)
            work[request.priority] = work.get(request.priority, 0.0) + request.cost_s
        self.work_by_priority = work

    async def wait_for_arrival(self, clock: Clock, until: float | None = None) -> None:
        """Until the next arrival, or `until` on `clock`, whichever comes first."""
        self._arrival.clear()
        wake = None if until is None else clock.call_at(until, self._arrival.set)
        try:
            await self._arrival.wait()
        finally:
            if wake is not None:
                wake.cancel()
