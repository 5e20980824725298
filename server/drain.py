"""Graceful shutdown: once draining, readiness and new work get 503 while accepted work finishes."""

from __future__ import annotations

import asyncio
import time


class DrainState:
    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def begin(self) -> None:
        self.draining = True

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

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
