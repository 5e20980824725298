"""The event loop's lag: a loop blocked by a callback shows it, an idle one does not."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram

from ferry.server import loop_lag
from ferry.server.loop_lag import LoopLagWatch

pytestmark = pytest.mark.unit

BUCKETS = (0.025, 0.25, float("inf"))


def lags(histogram: Histogram) -> dict[float, float]:
    """Observations per bucket's upper bound (not cumulative)."""
    (family,) = histogram.collect()
    cumulative = [s.value for s in family.samples if s.name.endswith("_bucket")]
    return dict(zip(BUCKETS, np.diff(cumulative, prepend=0.0), strict=True))


def watched(blocking_s: float) -> dict[float, float]:
    histogram = Histogram("lag", "lag", buckets=BUCKETS, registry=CollectorRegistry())

    async def scenario() -> None:
        watch = LoopLagWatch(histogram)
        watch.start()
        await asyncio.sleep(loop_lag.LAG_EVERY_S * 4)
        if blocking_s:
            time.sleep(blocking_s)  # a callback that holds the loop
        await asyncio.sleep(loop_lag.LAG_EVERY_S * 4)
        await watch.stop()

    asyncio.run(scenario())
    return lags(histogram)


def test_a_blocked_loop_is_seen_late_by_about_the_block():
    seen = watched(blocking_s=0.4)
    assert seen[float("inf")] >= 1  # the wake the block delayed, by over 0.25 s
    assert seen[0.025] >= 4


def test_an_idle_loop_wakes_on_time():
    seen = watched(blocking_s=0)
    assert seen[float("inf")] == 0 and seen[0.025] >= 4
