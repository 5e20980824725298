"""How late the event loop runs what is due: `ferry_event_loop_lag_seconds`.

Everything a serving process answers waits for its event loop: a request's bytes are read, a
batch is formed and an answer written only when the loop gets to them. When it runs one long
callback (a large body parsed in place, a burst of a batch's answers), or waits for the GIL or
a core, a probe or a request that arrived meanwhile waits too. A timer is the cheapest witness:
every LAG_EVERY_S a task asks to wake and records how late it woke, as Node.js's
`eventLoopLag` and prom-client's `nodejs_eventloop_lag_seconds` do. On a quiet server the lag
is tens of microseconds. Under bench.images with JPEGs decoded by Ferry on 2 cores, 6-10 % of
the wakes came over 5 ms late; with a 2 ms wake and its thread's CPU time over each late wait,
the slowest (12-77 ms) were the loop's own work, not the scheduler's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from prometheus_client import Histogram

from ferry.server.metrics import FerryMetrics
from ferry.server.procs.process_role import process_role

LAG_EVERY_S = 0.05  # 20 wakes a second: ~0.1 % of a core, and a stall of 50 ms is never missed


class LoopLagWatch:
    def __init__(self, lag: Histogram) -> None:
        self._lag = lag
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            due = time.perf_counter() + LAG_EVERY_S
            await asyncio.sleep(LAG_EVERY_S)
            self._lag.observe(max(0.0, time.perf_counter() - due))


def watch_loop_lag(metrics: FerryMetrics) -> LoopLagWatch:
    """Time this process's running loop, under its role's label (server, api, replica, engine)."""
    watch = LoopLagWatch(metrics.event_loop_lag.labels(process_role()))
    watch.start()
    return watch
