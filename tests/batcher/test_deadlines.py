"""The batcher's deadline heap (batcher/deadlines.py) on a clock the test moves: each request
expires at its own deadline whatever order they came in, one that ended first never does and
is not kept, and ended entries are swept out."""

from __future__ import annotations

import gc
import weakref

import pytest

from ferry.batcher.deadlines import SWEEP_AFTER, Deadlines
from tests.batcher.manual_clock import ManualClock

pytestmark = pytest.mark.unit


class Request:
    """Stands for a queued request: the heap only hands it back."""

    def __init__(self, name: str) -> None:
        self.name = name


def expiring(clock: ManualClock) -> tuple[Deadlines, list[tuple[str, float]]]:
    expired: list[tuple[str, float]] = []
    deadlines = Deadlines(lambda request: expired.append((request.name, clock.time())))
    return deadlines, expired


async def test_each_request_expires_at_its_own_deadline_in_any_order():
    clock = ManualClock(start=0.0)
    deadlines, expired = expiring(clock)
    # Later arrivals with earlier deadlines re-arm the timer; equal deadlines keep arrival order.
    for name, at in (("e", 5.0), ("a", 1.0), ("c", 3.0), ("b", 1.0), ("d", 2.0)):
        deadlines.add(Request(name), at, clock)
    await clock.advance(0.999)
    assert expired == []
    await clock.advance(10)
    assert expired == [("a", 1.0), ("b", 1.0), ("d", 2.0), ("c", 3.0), ("e", 5.0)]


async def test_a_request_that_ended_never_expires_and_is_not_kept():
    clock = ManualClock(start=0.0)
    deadlines, expired = expiring(clock)
    ended, waiting = Request("ended"), Request("waiting")
    entry = deadlines.add(ended, 1.0, clock)
    deadlines.add(waiting, 2.0, clock)
    deadlines.drop(entry)
    deadlines.drop(entry)  # a second drop (its future's callback after an expiry) is harmless
    gone = weakref.ref(ended)
    del ended
    gc.collect()
    assert gone() is None  # the heap holds no request that ended
    await clock.advance(3)
    assert expired == [("waiting", 2.0)]


async def test_ended_entries_are_swept_out():
    clock = ManualClock(start=0.0)
    deadlines, expired = expiring(clock)
    entries = [deadlines.add(Request(str(i)), 100.0 + i, clock) for i in range(4 * SWEEP_AFTER)]
    for entry in entries[:-3]:
        deadlines.drop(entry)
    assert len(deadlines._heap) <= SWEEP_AFTER + 3  # not one entry per request ever queued
    await clock.advance(200 + 4 * SWEEP_AFTER)
    assert [name for name, _ in expired] == [
        str(i) for i in range(4 * SWEEP_AFTER - 3, 4 * SWEEP_AFTER)
    ]


async def test_nothing_expires_once_stopped():
    clock = ManualClock(start=0.0)
    deadlines, expired = expiring(clock)
    deadlines.add(Request("a"), 1.0, clock)
    deadlines.stop()
    await clock.advance(2)
    assert expired == []
