"""A clock the tests move by hand: the batcher's waits, deadlines and timeouts fire when a test
advances it, never because wall time passed. Deterministic on a loaded machine.

The replay's virtual clock (bench/virtual_clock.py) with the steps a test takes itself: the
replay jumps from timer to timer until its run ends; a test moves a chosen amount of time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from ferry.bench.virtual_clock import VirtualClock

T = TypeVar("T")

# Enough turns of the event loop for every ready task to run to its next real wait (the
# batcher's collect -> dispatch -> infer -> scatter chain is a handful of hops).
SETTLE_TURNS = 50


async def settle() -> None:
    """Let every task that can run, run; time does not move."""
    for _ in range(SETTLE_TURNS):
        await asyncio.sleep(0)


class ManualClock(VirtualClock):
    """Satisfies the batcher's `Clock` (time, call_at) and adds `advance` and `sleep`."""

    def __init__(self, start: float = 1000.0) -> None:
        super().__init__(start)

    async def advance(self, seconds: float) -> None:
        """Move time forward, firing each due timer at its own time and settling after it."""
        target = self.now + seconds
        await settle()
        while (due := self.next_due()) is not None and due <= target:
            self.fire_next()
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
