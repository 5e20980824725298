"""A clock the tests move by hand: the batcher's waits, deadlines and timeouts fire when a test
advances it, never because wall time passed. Deterministic on a loaded machine."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# Enough turns of the event loop for every ready task to run to its next real wait (the
# batcher's collect -> dispatch -> infer -> scatter chain is a handful of hops).
SETTLE_TURNS = 50


async def settle() -> None:
    """Let every task that can run, run; time does not move."""
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


class Timer:
    def __init__(self, when: float, callback: Callable[..., Any], args: tuple) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """Satisfies the batcher's `Clock` (time, call_at) and adds `advance` and `sleep`."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Timer:
        timer = Timer(when, callback, args)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        """A backend's work or a client's pause, in this clock's time."""
        done = asyncio.get_running_loop().create_future()
        self.call_at(self.now + seconds, lambda: done.done() or done.set_result(None))
        await done

    async def advance(self, seconds: float) -> None:
        """Move time forward, firing each due timer at its own time and settling after it."""
        target = self.now + seconds
        await settle()
        while self._timers and self._timers[0][0] <= target:
            # Like the event loop: every timer due at one instant fires before any task runs.
            when = self._timers[0][0]
            self.now = max(self.now, when)
            while self._timers and self._timers[0][0] == when:
                _, _, timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    timer.callback(*timer.args)
            await settle()
        self.now = target
        await settle()

    async def run_until_done(
        self, awaitable: Awaitable[T], step_s: float = 0.001, limit_s: float = 10.0
    ) -> T:
        """Advance in small steps until `awaitable` finishes (at most `limit_s` of clock time)."""
        task = asyncio.ensure_future(awaitable)
        end = self.now + limit_s
        await settle()
        while not task.done():
            if self.now >= end:
                task.cancel()
                raise AssertionError(f"not done after {limit_s}s of clock time")
            await self.advance(step_s)
        return task.result()
