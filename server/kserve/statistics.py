"""Triton's statistics extension, read from Ferry's Prometheus metrics (one source of numbers).

Per model: requests answered (`success`/`fail` by status class, from `ferry_requests_total`, on
every route and protocol), request time (`ferry_request_duration_seconds`, which is not split by
outcome, so `success.ns` covers all requests), queue wait (`ferry_queue_wait_seconds`), backend
time (`compute_infer`, counted per batch: `ferry_backend_inference_seconds`; input and output
preparation are not measured apart, so their counts follow it with 0 ns), rows inferred
(`inference_count`, from `ferry_batch_rows_total`: +8 for a request of 8 rows, as Triton
counts) and batches run (`execution_count`). Durations are integers in nanoseconds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry

from ferry.server.kserve.versions import VERSION

NS = 1_000_000_000


def _samples(registry: CollectorRegistry) -> dict[str, dict[str, float]]:
    """sample name -> model -> value, summed over every other label; statuses as a suffix."""
    values: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in registry.collect():
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            name = sample.name
            if name == "ferry_requests_total":
                name += ":ok" if sample.labels.get("status", "").startswith("2") else ":fail"
            values[name][model] += sample.value
    return values


def _stat(count: float, seconds: float = 0.0) -> dict[str, int]:
    return {"count": int(count), "ns": int(seconds * NS)}


def model_statistics(registry: CollectorRegistry, names: list[str]) -> dict[str, Any]:
    v = _samples(registry)
    stats = []
    for name in names:
        ok = v["ferry_requests_total:ok"][name]
        failed = v["ferry_requests_total:fail"][name]
        batches = v["ferry_backend_inference_seconds_count"][name]
        stats.append(
            {
                "name": name,
                "version": VERSION,
                "last_inference": 0,
                "inference_count": int(v["ferry_batch_rows_total"][name]),
                "execution_count": int(batches),
                "inference_stats": {
                    "success": _stat(ok, v["ferry_request_duration_seconds_sum"][name]),
                    "fail": _stat(failed),
                    "queue": _stat(
                        v["ferry_queue_wait_seconds_count"][name],
                        v["ferry_queue_wait_seconds_sum"][name],
                    ),
                    # perf_analyzer requires the three compute counts to agree.
                    "compute_input": _stat(batches),
                    "compute_infer": _stat(batches, v["ferry_backend_inference_seconds_sum"][name]),
                    "compute_output": _stat(batches),
                    "cache_hit": _stat(0),
                    "cache_miss": _stat(0),
                },
                "batch_stats": [],
            }
        )
    return {"model_stats": stats}
