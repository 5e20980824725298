"""The batcher's queue metrics at the engine loop's rate (server/metrics.py): the depth gauge is
written once per loop turn, a batch's queue waits at once (observe_all), each as the one-by-one
writes would leave them."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, Histogram

from ferry.server.metrics import FerryMetrics
from ferry.server.turn_writes import observe_all

pytestmark = pytest.mark.unit


async def test_the_queue_depth_is_written_once_a_loop_turn_with_its_last_value():
    registry = CollectorRegistry()
    observer = FerryMetrics(registry).batch_observer("m", "ort")

    def depth() -> float | None:
        return registry.get_sample_value("ferry_queue_depth", {"model": "m"})

    observer.queue_depth(3)
    observer.queue_depth(1)
    assert depth() == 0  # not yet: at the end of this turn
    await asyncio.sleep(0)
    assert depth() == 1
    observer.queue_depth(2)
    await asyncio.sleep(0)
    assert depth() == 2


def test_without_a_running_loop_the_queue_depth_is_written_at_once():
    registry = CollectorRegistry()
    FerryMetrics(registry).batch_observer("m", "ort").queue_depth(4)
    assert registry.get_sample_value("ferry_queue_depth", {"model": "m"}) == 4


@pytest.mark.parametrize(
    "amounts",
    [
        [],
        [0.3],
        # On bucket bounds exactly, between them, below the first, past the last finite one,
        # negative, repeated, and NaN (counted in no bucket).
        [0.005, 0.0051, 0.0, -1.0, 10.0, 11.0, 1e9, 0.25, 0.25, 0.25, math.nan],
    ],
)
def test_a_batch_of_observations_counts_as_observing_them_one_by_one(amounts):
    def samples(observe: Callable[[Histogram], None]) -> list[tuple[str, dict, str]]:
        registry = CollectorRegistry()
        histogram = Histogram("h", "h", ("model",), registry=registry).labels("m")
        observe(histogram)
        (metric,) = (m for m in registry.collect() if m.name == "h")
        # Values compared by their text: a NaN sum is unequal to itself.
        return [
            (s.name, s.labels, repr(s.value)) for s in metric.samples if "created" not in s.name
        ]

    def one_by_one(histogram: Histogram) -> None:
        for amount in amounts:
            histogram.observe(amount)

    assert samples(lambda h: observe_all(h, amounts)) == samples(one_by_one)
