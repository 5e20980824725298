"""Merging the processes' metrics: gauges lose the multiprocess `pid` label, dead ones go, and a
scrape never fails on a file another process is creating or deleting."""

from __future__ import annotations

import json
import threading

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.samples import Sample

from ferry.server.procs.metrics_merge import MergedRegistry, _without_pid, forget_process

pytestmark = pytest.mark.unit

GAUGE = "ferry_in_flight_requests"


def test_gauge_samples_are_summed_over_processes_with_their_own_labels():
    gauge = Metric("ferry_in_flight_requests", "in flight", "gauge")
    gauge.samples = [
        Sample("ferry_in_flight_requests", {"endpoint": "/predict", "pid": "10"}, 3.0),
        Sample("ferry_in_flight_requests", {"endpoint": "/predict", "pid": "11"}, 2.0),
        Sample("ferry_in_flight_requests", {"endpoint": "/v1", "pid": "11"}, 1.0),
    ]
    merged = _without_pid(gauge)
    assert (merged.name, merged.type) == ("ferry_in_flight_requests", "gauge")
    assert sorted((s.labels["endpoint"], s.value) for s in merged.samples) == [
        ("/predict", 5.0),
        ("/v1", 1.0),
    ]
    assert all("pid" not in s.labels for s in merged.samples)


def test_a_dead_process_loses_its_gauges_and_keeps_its_counters(tmp_path):
    names = ["gauge_all_42.db", "gauge_livesum_42.db", "gauge_all_7.db", "counter_42.db"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    forget_process(str(tmp_path), 42)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_42.db", "gauge_all_7.db"]


def _write_series(path, file_name: str, metric: str, sample: str, value: float) -> None:
    """A process's file as prometheus_client's own writer leaves it."""
    key = json.dumps([metric, sample, {"endpoint": "/predict"}, "help"])
    values = MmapedDict(str(path / file_name))
    values.write_value(key, value, 0.0)
    values.close()


def _scraped(registry: MergedRegistry) -> dict[str, float]:
    return {s.name: s.value for m in registry.collect() for s in m.samples}


def test_a_file_not_yet_sized_by_its_writer_is_read_as_empty(tmp_path):
    _write_series(tmp_path, "counter_10.db", "ferry_requests", "ferry_requests_total", 3.0)
    (tmp_path / "counter_11.db").write_bytes(b"")  # opened, not yet truncated to its size
    assert _scraped(MergedRegistry(str(tmp_path)))["ferry_requests_total"] == 3.0


def test_scrapes_survive_processes_coming_and_going(tmp_path):
    _write_series(tmp_path, "counter_10.db", "ferry_requests", "ferry_requests_total", 3.0)
    _write_series(tmp_path, "gauge_all_10.db", GAUGE, GAUGE, 1.0)
    registry = MergedRegistry(str(tmp_path))
    stop = threading.Event()

    def churn() -> None:
        pid = 1000
        while not stop.is_set():
            pid += 1
            (tmp_path / f"gauge_all_{pid}.db").write_bytes(b"")
            _write_series(tmp_path, f"gauge_all_{pid}.db", GAUGE, GAUGE, 1.0)
            forget_process(str(tmp_path), pid)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for _ in range(300):
            assert _scraped(registry)["ferry_requests_total"] == 3.0
    finally:
        stop.set()
        churner.join()
