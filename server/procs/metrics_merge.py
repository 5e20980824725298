"""One /metrics for all processes: prometheus_client's multiprocess files, merged.

Every process (API and engine) writes its series to memory-mapped files in one directory
(PROMETHEUS_MULTIPROC_DIR, set by the supervisor before any child starts), as vLLM does with
`--api-server-count`. Counters and histograms are summed across processes by prometheus_client;
gauges carry a `pid` label there, which is summed away here, so every family keeps exactly the
labels of a single-process server (the dashboards and alerts read the same series). Each gauge
has one writer: `ferry_in_flight_requests` and `ferry_engine_unanswered_bytes` are the sums of
the API processes' own, the batch and engine gauges are written by the engine process only. With
`replicas` every replica writes every gauge: the sums are the server's (in flight, queued, queue
capacity), and the gauges of a state that each replica holds a copy of are declared with their
own rule instead (`ferry_model_ready`: the least of them, so 1 only where every replica has the
model; the cost model's coefficients: the most recent replica's). The supervisor deletes a dead
process's gauge files, so a killed process's in-flight count leaves with it.

A scrape reads files that other processes create and delete while it runs: a file listed may be
gone (a dead process's gauges), or may exist before its writer has sized it (a process's first
series of a kind). prometheus_client forgives only the first, and only for `live*` gauges; either
would answer /metrics with a 500. A scrape that meets one lists the directory again.
"""

from __future__ import annotations

import contextlib
import glob
import os
import struct
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.samples import Sample

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class MergedRegistry(CollectorRegistry):
    """The registry the API processes' FerryMetrics register into: its own metric objects only
    write their files; a scrape reads every process's files (and this process's custom
    collectors, such as the GPU one, which are per host, not per process)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            collectors = list(self._collector_to_names)
        for metric in self._file_metrics():
            yield _without_pid(metric) if metric.type == "gauge" else metric
        for collector in collectors:
            if not isinstance(collector, MetricWrapperBase):
                yield from collector.collect()

    def _file_metrics(self) -> Iterable[Metric]:
        for _ in range(_LISTINGS - 1):
            try:
                return self._merged_listing()
            except (FileNotFoundError, struct.error):
                continue  # a file created or deleted between the listing and its read
        return self._merged_listing()

    def _merged_listing(self) -> Iterable[Metric]:
        files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if _sized(f)]
        merged: list[Metric] = MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
        return merged


_LISTINGS = 5


def _sized(name: str) -> bool:
    """False for a file whose writer has not sized it yet (it holds no series) or that is gone."""
    try:
        return os.path.getsize(name) > 0
    except FileNotFoundError:
        return False


def _without_pid(metric: Metric) -> Metric:
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in metric.samples:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "pid"))
        key = (sample.name, labels)
        totals[key] = totals.get(key, 0.0) + sample.value
    merged = Metric(metric.name, metric.documentation, metric.type, metric.unit)
    merged.samples = [Sample(name, dict(labels), value) for (name, labels), value in totals.items()]
    return merged


def forget_process(path: str, pid: int) -> None:
    """A dead process's gauges are gone (its counters stay: they were counted)."""
    for name in _gauge_files(path, pid):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def _gauge_files(path: str, pid: int) -> Iterable[str]:
    return glob.glob(os.path.join(path, f"gauge_*_{pid}.db"))
