"""The start-up heap frozen out of collections, and each collection timed (server/gc_pauses.py)."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading

import pytest
from prometheus_client import CollectorRegistry

from ferry.server.gc_pauses import GcPauseWatch, freeze_startup_heap
from ferry.server.metrics import FerryMetrics
from tests.support.metrics import metric_value
from tests.support.server_processes import pids, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def metrics():
    return FerryMetrics(CollectorRegistry())


def _pauses(metrics: FerryMetrics, generation: str, sample: str = "count") -> float:
    return metrics.registry.get_sample_value(
        f"ferry_gc_pause_seconds_{sample}", {"generation": generation}
    )


def test_each_collection_is_timed_under_its_generation(metrics):
    watch = GcPauseWatch(metrics)
    watch.install()
    try:
        gc.collect(2)
        gc.collect(1)
    finally:
        watch.remove()
    watch.flush()  # no event loop here to observe them
    assert _pauses(metrics, "2") == 1 and _pauses(metrics, "2", "sum") > 0
    assert _pauses(metrics, "1") == 1
    gc.collect(2)  # removed: no longer counted
    watch.flush()
    assert _pauses(metrics, "2") == 1


def test_a_collection_inside_the_metrics_lock_does_not_take_it(metrics):
    """prometheus_client's multiprocess values share one lock, and a collection can start
    while it is held (a new series being set up): observing there would wait on it forever."""
    lock = threading.Lock()
    inside: list[bool] = []

    class Locked:
        def observe(self, seconds: float) -> None:
            taken = lock.acquire(blocking=False)  # held by the collecting thread: not free
            inside.append(not taken)
            if taken:
                lock.release()

    watch = GcPauseWatch(metrics)
    watch._pauses = dict.fromkeys((0, 1, 2), Locked())
    watch.install()
    try:
        with lock:
            gc.collect(2)
    finally:
        watch.remove()
    watch.flush()
    assert inside == [False]  # observed once, after the lock was let go


def test_freezing_takes_what_is_alive_out_of_collections(metrics):
    alive = [object()]  # a container: the collector tracks it
    assert any(o is alive for o in gc.get_objects())
    try:
        frozen = freeze_startup_heap(metrics)
        assert not any(o is alive for o in gc.get_objects())
        # Frozen objects can still die (another thread of this process may drop some), none
        # can join: the count now is at most the one at freezing.
        assert 0 < gc.get_freeze_count() <= frozen
        assert metrics.registry.get_sample_value("ferry_gc_frozen_objects") == frozen
    finally:
        gc.unfreeze()  # this test process goes on collecting as before


def test_a_serving_process_froze_its_heap_and_times_its_collections(kserve):
    """The real server: one process, or API processes and an engine process (the fewest
    frozen of any of them; their collections summed)."""
    kserve.metrics()  # a scrape allocates enough for young collections

    def frozen_everywhere() -> str | None:
        # A start-up heap is ~100k objects (FastAPI, pydantic, NumPy, ONNX Runtime, the app).
        # An API process may be marked ready (connected to the engine) a moment before its
        # server has started and frozen it: the fewest of any process is 0 until then.
        text = kserve.metrics()
        return text if metric_value(text, "ferry_gc_frozen_objects") > 20_000 else None

    text = wait_until(frozen_everywhere, what="every process's start-up heap frozen")
    assert metric_value(text, "ferry_gc_pause_seconds_count", generation="0") > 0
    # Its event loops' wakes are timed too (server/loop_lag.py), by the process's role.
    lag = "ferry_event_loop_lag_seconds_count"
    roles = ("api", "engine") if pids(kserve, "api") else ("server",)
    assert all(metric_value(text, lag, process=role) > 0 for role in roles)


def test_a_collection_after_the_serving_loop_closed_raises_nothing(metrics, monkeypatch):
    """Interpreter shutdown collects after uvicorn's loop is closed: that collection used to
    print `RuntimeError: Event loop is closed` from this callback at every stop."""
    unraisable: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hook: unraisable.append(hook.exc_value))
    watch = GcPauseWatch(metrics)

    async def serving() -> None:
        watch.install()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(serving())
    loop.close()
    try:
        gc.collect(2)
    finally:
        watch.remove()
    assert unraisable == []
    assert _pauses(metrics, "2") == 1  # noted, and observed by remove's flush
