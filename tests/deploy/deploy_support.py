"""tests/deploy helpers: dashboard queries, metric names, Prometheus queries."""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus missing: run `bash tools/install_prometheus.sh`",
)

# What Triton exports on :8002/metrics (docs/user_guide/metrics.md of triton-inference-server/
# server, r24.08): per-model counters and gauges (labels model, version), GPU and CPU gauges.
TRITON_METRICS = frozenset(
    {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_pending_request_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
        "nv_cache_num_hits_per_model",
        "nv_cache_num_misses_per_model",
        "nv_cache_hit_duration_per_model",
        "nv_cache_miss_duration_per_model",
    }
)
# Series Prometheus itself attaches to every target.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


def sample_names(family: str, kind: str) -> set[str]:
    """The series names a metric family of this type exposes."""
    if kind == "histogram":
        return {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
    if kind == "counter":
        return {family if family.endswith("_total") else f"{family}_total"}
    return {family}


def ferry_series_names() -> set[str]:
    """Every series name Ferry exports: server/metrics.py's registry (LLM families included)."""
    from ferry.server.gpu_metrics import GpuCollector
    from ferry.server.metrics import FerryMetrics

    names: set[str] = set()
    for family in FerryMetrics().registry.collect():
        names |= sample_names(family.name, family.type)
    # The GPU families are collected only where a GPU is; their description is the same anywhere.
    for family in GpuCollector(None).describe():
        names |= sample_names(family.name, family.type)
    return names


# PromQL words that look like identifiers but are not metric names.
_PROMQL_WORDS = frozenset(
    re.split(
        r"\s+",
        "sum min max avg count stddev stdvar topk bottomk quantile count_values group by without "
        "on ignoring group_left group_right bool and or unless offset rate irate increase delta "
        "idelta deriv histogram_quantile label_values vector scalar abs ceil floor round "
        "clamp_min clamp_max avg_over_time max_over_time min_over_time sum_over_time "
        "count_over_time absent time humanize inf nan",
    )
)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads: identifiers outside {...} and (...) grouping lists."""
    stripped = re.sub(r"\{[^}]*\}", "{}", expr)  # label matchers
    stripped = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", stripped)
    stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # range selectors
    stripped = re.sub(r'"[^"]*"', "", stripped)
    names = set(re.findall(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", stripped))
    return {n for n in names if n.lower() not in _PROMQL_WORDS}


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    legend: str
    expr: str


def load_dashboard(name: str) -> dict:
    return json.loads((DASHBOARDS / name).read_text())


def dashboard_queries(name: str) -> list[Query]:
    spec = load_dashboard(name)
    return [
        Query(name, panel["title"], target.get("legendFormat", ""), target["expr"])
        for panel in spec["panels"]
        for target in panel.get("targets", [])
    ]


def instant_query(prometheus: str, expr: str) -> list[dict]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    return body["data"]["result"]


def finite_values(result: list[dict]) -> list[float]:
    values = [float(series["value"][1]) for series in result]
    return [v for v in values if math.isfinite(v)]


def scraped_total(prometheus: str, expr: str) -> float:
    result = instant_query(prometheus, expr)
    return sum(finite_values(result))
