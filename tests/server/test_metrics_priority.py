"""Queue wait by priority (server/metrics.py): configured levels get their own series, every
other priority one "other" series, so clients cannot grow the label set."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from ferry.batcher import FormedBatch
from ferry.server.metrics import FerryMetrics

pytestmark = pytest.mark.unit


def test_queue_wait_is_labelled_by_configured_level_or_other():
    registry = CollectorRegistry()
    observer = FerryMetrics(registry, priority_levels=(-10, 0)).batch_observer("m", "ort")
    observer.batch_formed(FormedBatch(2, 8, 8, [0.1, 0.2], -10, 2))
    observer.batch_formed(FormedBatch(1, 4, 4, [0.3], 7, 1))
    observer.batch_formed(FormedBatch(1, 4, 4, [0.4], -11, 1))

    def count(priority: str) -> float | None:
        return registry.get_sample_value(
            "ferry_queue_wait_seconds_count", {"model": "m", "priority": priority}
        )

    assert (count("-10"), count("0"), count("other")) == (2, 0, 2)
    assert count("7") is None and count("-11") is None
