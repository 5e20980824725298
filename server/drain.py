"""Graceful shutdown: once draining, readiness and new work get 503 while accepted work finishes."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class DrainState:
    def __init__(self) -> None:
        self.draining = False
        # The drain deadline passed: what still runs is cancelled and answered 503 (or its stream
        # ended with an error event), never left to the server's bare 500.
        self.expired = False
        self.in_flight = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def begin(self) -> None:
        self.draining = True

    def enter(self, task: asyncio.Task[Any] | None = None) -> None:
        """Count the calling task (or `task`, where the caller has it at hand) in flight."""
        self.count_in()
        task = task or asyncio.current_task()
        if task is not None:
            self._tasks.add(task)

    def leave(self, task: asyncio.Task[Any] | None = None) -> None:
        self._tasks.discard(task or asyncio.current_task())
        self.count_out()

    def count_in(self) -> None:
        """Count a request in flight that no task serves (server/direct_lane.py's): it has
        nothing to cancel, and looking for the current task cost it ~1.5 us."""
        self.in_flight += 1
        self._idle.clear()

    def count_out(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def expire(self) -> None:
        """Cancel every request still in flight; each answers for itself as it unwinds."""
        self.expired = True
        for task in list(self._tasks):
            task.cancel()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True when every accepted request finished within the timeout."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._idle.wait(), remaining)
            except TimeoutError:
                return False
        return True
