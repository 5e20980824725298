"""Requests' deadlines on one timer per batcher: the earliest armed, the rest in a heap.

A timer per request (the loop's `call_at`, cancelled when its answer came) cost ~5 us a request
on uvloop, made and cancelled: as much as a small tabular graph's own share of its batch. Here a
request's deadline is a heap entry, and the one timer is armed for the earliest; a request that
ends first only has its entry emptied (the heap keeps no request alive), and the emptied
entries are swept out once they outnumber the live ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from ferry.batcher.request import QueuedRequest
from ferry.batcher.types import Clock

# Emptied entries tolerated before a sweep, whatever the live count: a sweep rebuilds the heap.
SWEEP_AFTER = 1024


# [deadline, arrival number, the request or None once it ended]: ordered by deadline, then
# arrival; a list so that a request that ends empties its entry in place.
Entry = list[Any]


class Deadlines:
    def __init__(self, expire: Callable[[QueuedRequest], None]) -> None:
        self._expire = expire
        self._heap: list[Entry] = []
        self._arrivals = 0
        self._emptied = 0
        self._clock: Clock | None = None
        self._timer: Any = None  # the clock's handle for the armed timer
        self._armed_for: float | None = None  # the deadline it is armed for

    def add(self, request: QueuedRequest, deadline: float, clock: Clock) -> Entry:
        """`request` expires at `deadline` unless `drop`ped first; the entry to drop it by."""
        self._clock = clock
        self._arrivals += 1
        entry: Entry = [deadline, self._arrivals, request]
        heapq.heappush(self._heap, entry)
        if self._armed_for is None or deadline < self._armed_for:
            self._arm(deadline)
        return entry

    def drop(self, entry: Entry) -> None:
        """The request ended before its deadline: it no longer expires."""
        if entry[2] is None:
            return
        entry[2] = None
        self._emptied += 1
        if self._emptied > SWEEP_AFTER and self._emptied > len(self._heap) // 2:
            self._heap = [e for e in self._heap if e[2] is not None]
            heapq.heapify(self._heap)
            self._emptied = 0

    def stop(self) -> None:
        """No timer left armed (the batcher closed; its requests all ended)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._armed_for = None

    def _arm(self, deadline: float) -> None:
        assert self._clock is not None, "armed before any deadline was added"
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._clock.call_at(deadline, self._due)
        self._armed_for = deadline

    def _due(self) -> None:
        self._timer = self._armed_for = None
        assert self._clock is not None, "due before any deadline was added"
        now = self._clock.time()
        heap = self._heap
        while heap and (heap[0][2] is None or heap[0][0] <= now):
            entry = heapq.heappop(heap)
            request = entry[2]
            if request is None:
                self._emptied -= 1
                continue
            entry[2] = None
            self._expire(request)
        if heap:
            self._arm(heap[0][0])
