"""The garbage collector off the serving path: the start-up heap frozen, every pause measured.

A full (generation 2) collection walks every object the process holds. Once the models are up
that is FastAPI, pydantic, NumPy, ONNX Runtime's Python side and the app: ~100k objects. Under
the mixed /predict load (bench.peers) one such collection came every ~20 s and took 40-55 ms,
with the event loop and the worker threads that start the next batch all stopped (both need the
GIL): every request in flight paid it, a p99 tail of their own. Frozen after start-up, as vLLM
does after its warm-up, the same collection took 0.5 ms. Objects made while serving are still
collected as before.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from ferry.server.metrics import FerryMetrics

logger = logging.getLogger(__name__)


class GcPauseWatch:
    """A `gc.callbacks` entry: each collection's duration into `ferry_gc_pause_seconds`.

    Noted during the collection, observed after it (on the event loop, or by `flush`): a
    collection can start while its thread holds prometheus_client's one multiprocess lock
    (setting up a new series, `api_servers` > 1), and observing there takes that lock again,
    which froze an API process for good."""

    def __init__(self, metrics: FerryMetrics) -> None:
        self._pauses = {
            generation: metrics.gc_pause.labels(str(generation)) for generation in (0, 1, 2)
        }
        self._started = 0.0
        self._noted: list[tuple[int, float]] = []  # appended under the GIL: no lock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        # Collections never overlap (they hold the GIL), so one start time is enough.
        if phase == "start":
            self._started = time.perf_counter()
            return
        self._noted.append((info["generation"], time.perf_counter() - self._started))
        loop = self._loop
        if loop is None or self._scheduled:
            return
        if loop.is_closed():  # the server has stopped: nothing is observed any more
            self._loop = None
            return
        self._scheduled = True
        try:
            loop.call_soon_threadsafe(self.flush)
        except RuntimeError:  # closed by another thread meanwhile (a worker's collection)
            self._loop = None

    def flush(self) -> None:
        """Observe the pauses noted so far."""
        self._scheduled = False
        while self._noted:
            generation, seconds = self._noted.pop()
            self._pauses[generation].observe(seconds)

    def install(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: pauses are observed by `flush`
            self._loop = None
        gc.callbacks.append(self)

    def remove(self) -> None:
        """Stop timing collections (the serving loop is about to close); idempotent."""
        if self in gc.callbacks:
            gc.callbacks.remove(self)
        self._loop = None
        self.flush()


def freeze_startup_heap(metrics: FerryMetrics) -> int:
    """Collect once, then move every object alive into the permanent generation, which
    collections skip. Call it once the models are started: what start-up built lives as long
    as the process. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    metrics.gc_frozen_objects.set(frozen)
    logger.info("gc: %d start-up objects frozen out of collections", frozen)
    return frozen


def keep_gc_off_serving_path(metrics: FerryMetrics) -> GcPauseWatch:
    """What a serving process calls once it is ready: freeze the start-up heap and time every
    collection from now on."""
    freeze_startup_heap(metrics)
    watch = GcPauseWatch(metrics)
    watch.install()
    return watch
