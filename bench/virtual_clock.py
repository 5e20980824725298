"""A virtual clock for replays: the batcher's waits and a simulated backend's work take no time.

Satisfies the batcher's `Clock` (time, call_at). `run` drives a coroutine to its end: it lets
every ready task run, then jumps to the next timer, so a replay is deterministic and as fast as
the event loop, whatever else the machine is doing.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
# A cap on the turns one settle may take: a task that never waits would otherwise spin forever.
MAX_SETTLE_TURNS = 10_000


class _Timer:
    __slots__ = ("args", "callback", "cancelled")

    def __init__(self, callback: Callable[..., Any], args: tuple) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> _Timer:
        timer = _Timer(callback, args)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        done = asyncio.get_running_loop().create_future()
        self.call_at(self.now + seconds, _set_once, done)
        await done

    def next_due(self) -> float | None:
        """When the next timer is due (None: none is set)."""
        return self._timers[0][0] if self._timers else None

    def fire_next(self) -> None:
        """Move to the next timer's time and fire every timer due then.

        Like the event loop: every timer due at one instant fires before any task runs.
        """
        when = self._timers[0][0]
        self.now = max(self.now, when)
        while self._timers and self._timers[0][0] == when:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback(*timer.args)

    async def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run `main` to its end in virtual time (an error if it waits on nothing timed)."""
        task = asyncio.ensure_future(main)
        while True:
            await _settle()
            if task.done():
                return task.result()
            if not self._timers:
                task.cancel()
                raise RuntimeError("the replay waits on nothing timed: it would never finish")
            self.fire_next()


def _set_once(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def _settle() -> None:
    """Yield until no other callback is ready to run (time does not move)."""
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)  # asyncio's own loop; others get a fixed number of turns
    for _ in range(MAX_SETTLE_TURNS if ready is not None else 50):
        await asyncio.sleep(0)
        if ready is not None and not ready:
            return
