"""Per-request metric writes made once per loop turn (server/turn_writes.py): what a turn's
writes leave is what writing them one by one leaves, a reading through FerryMetrics.current()
sees them at once, and with no loop running they are written as they come."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ferry.server.metrics import FerryMetrics
from ferry.server.turn_writes import TurnWrites

pytestmark = pytest.mark.unit

DURATIONS = [0.0004, 0.003, 0.003, 0.2, 7.0, 0.05]


def series(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")  # when each was made, not what was written
    }


def declared(registry: CollectorRegistry) -> tuple[Counter, Gauge, Histogram]:
    return (
        Counter("answered", "a", ("status",), registry=registry),
        Gauge("in_flight", "b", registry=registry),
        Histogram("seconds", "c", registry=registry),
    )


async def test_a_turns_writes_leave_what_one_by_one_writes_leave():
    one_by_one, summed = CollectorRegistry(), CollectorRegistry()
    counter, gauge, histogram = declared(one_by_one)
    for amount in DURATIONS:
        gauge.inc()
        counter.labels("200").inc()
        histogram.observe(amount)
        gauge.dec()
    gauge.inc()  # one still in flight
    counter, gauge, histogram = declared(summed)
    writes = TurnWrites()
    for amount in DURATIONS:
        writes.add(gauge, 1)
        writes.add(counter.labels("200"), 1)
        writes.observe(histogram, amount)
        writes.add(gauge, -1)
    writes.add(gauge, 1)
    assert series(summed)[("answered_total", (("status", "200"),))] == 0  # not before the turn ends
    await asyncio.sleep(0)
    assert series(summed) == series(one_by_one)


async def test_a_reading_through_current_sees_this_turns_writes():
    metrics = FerryMetrics()
    metrics.request_answered("m", "/predict", 200, 0.01)
    shown = series(metrics.current())
    count = shown[
        ("ferry_requests_total", (("endpoint", "/predict"), ("model", "m"), ("status", "200")))
    ]
    assert count == 1


def test_with_no_loop_running_writes_are_made_at_once():
    counter, gauge, histogram = declared(registry := CollectorRegistry())
    writes = TurnWrites()
    writes.add(counter.labels("500"), 2)
    writes.add(gauge, -1)
    writes.observe(histogram, 0.5)
    shown = series(registry)
    assert shown[("answered_total", (("status", "500"),))] == 2
    assert shown[("in_flight", ())] == -1
    assert shown[("seconds_sum", ())] == 0.5
