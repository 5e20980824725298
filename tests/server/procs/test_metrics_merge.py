"""Merging the processes' metrics: gauges lose the multiprocess `pid` label, dead ones go."""

from __future__ import annotations

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from ferry.server.procs.metrics_merge import _without_pid, forget_process

pytestmark = pytest.mark.unit


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
