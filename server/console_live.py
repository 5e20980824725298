"""What the console's live view reads once a second: each model's counters and gauges, taken from
the same registry /metrics shows, as totals. The page keeps the history and turns two readings
into rates, mean batch sizes and windowed p50/p99 (as Prometheus' rate() and
histogram_quantile() would), so the server keeps no state for it and one reading costs one walk
of the registry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric

from ferry.server.metrics import LATENCY_BUCKETS_S

# The series read, by sample name (prometheus_client's: counters end in _total, histograms in
# _sum, _count and _bucket), to the field of the model's reading they add to.
_GAUGES = {
    "ferry_queue_depth": "queue_depth",
    "ferry_queue_capacity": "queue_capacity",
    "ferry_llm_requests_running": "llm_running",
    "ferry_llm_requests_waiting": "llm_waiting",
}
_TOTALS = {
    "ferry_batch_size_requests_count": "batches",
    "ferry_batch_size_requests_sum": "batched_requests",
    "ferry_batch_padding_ratio_count": "padding_count",
    "ferry_batch_padding_ratio_sum": "padding_sum",
    "ferry_llm_generation_tokens_total": "generated_tokens",
}
_REQUESTS = "ferry_requests_total"
_LATENCY = "ferry_request_duration_seconds_bucket"
_REJECTIONS = "ferry_rejections_total"
_CONNECTIONS_REFUSED = "ferry_connections_refused_total"
# The latency buckets' upper bounds as the page reads them (JSON has no +Inf: the last count,
# one past these, is every request).
LATENCY_BOUNDS_S = list(LATENCY_BUCKETS_S)


@dataclass
class ModelReading:
    queue_depth: float = 0
    queue_capacity: float = 0
    llm_running: float = 0
    llm_waiting: float = 0
    batches: float = 0
    batched_requests: float = 0
    padding_count: float = 0
    padding_sum: float = 0
    generated_tokens: float = 0
    requests: float = 0
    errors: float = 0  # answered with a 4xx or 5xx
    # Cumulative request counts per latency bound (every endpoint of the model), +Inf last.
    latency: list[float] = field(default_factory=lambda: [0.0] * (len(LATENCY_BOUNDS_S) + 1))
    rejections: dict[str, float] = field(default_factory=dict)


def _bound_index(le: str) -> int:
    bound = float(le)
    if math.isinf(bound):
        return len(LATENCY_BOUNDS_S)
    return LATENCY_BOUNDS_S.index(bound)


def read_live(metrics: Iterable[Metric]) -> dict[str, Any]:
    """Every served model's reading, and the connections refused before reaching a route.
    `metrics`: a registry's collect() (ServedSeries: served names only). Requests that named no
    served model (label "") are left out: they belong to no model's chart."""
    models: dict[str, ModelReading] = {}
    refused: dict[str, float] = {}
    for metric in metrics:
        for sample in metric.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == _CONNECTIONS_REFUSED:
                refused[labels["reason"]] = refused.get(labels["reason"], 0) + value
                continue
            model = labels.get("model", "")
            if not model:
                continue
            reading = models.setdefault(model, ModelReading())
            if name in _GAUGES or name in _TOTALS:
                attribute = _GAUGES.get(name) or _TOTALS[name]
                setattr(reading, attribute, getattr(reading, attribute) + value)
            elif name == _REQUESTS:
                reading.requests += value
                if labels["status"][:1] in ("4", "5"):
                    reading.errors += value
            elif name == _LATENCY:
                reading.latency[_bound_index(labels["le"])] += value
            elif name == _REJECTIONS:
                reason = labels["reason"]
                reading.rejections[reason] = reading.rejections.get(reason, 0) + value
    return {
        "latency_bounds_s": LATENCY_BOUNDS_S,
        "models": {name: vars(reading) for name, reading in sorted(models.items())},
        "connections_refused": refused,
    }
