"""tests/deploy helpers: real Ferry and Prometheus processes, dashboard queries, metric names."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from ferry.bench.server_process import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"

# Being added next to server/metrics.py by the LLM work; the LLM dashboard and rules use them.
LLM_METRICS = {
    "ferry_llm_time_to_first_token_seconds": "histogram",
    "ferry_llm_inter_token_latency_seconds": "histogram",
    "ferry_llm_request_duration_seconds": "histogram",
    "ferry_llm_prompt_tokens_total": "counter",
    "ferry_llm_generation_tokens_total": "counter",
    "ferry_llm_requests_finished_total": "counter",
    "ferry_llm_requests_running": "gauge",
    "ferry_llm_requests_waiting": "gauge",
}

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
    """Every series name Ferry exports: server/metrics.py's registry, plus the LLM metrics."""
    from ferry.server.gpu_metrics import GpuCollector
    from ferry.server.metrics import FerryMetrics

    names: set[str] = set()
    for family in FerryMetrics().registry.collect():
        names |= sample_names(family.name, family.type)
    # The GPU families are collected only where a GPU is; their description is the same anywhere.
    for family in GpuCollector(None).describe():
        names |= sample_names(family.name, family.type)
    for family, kind in LLM_METRICS.items():
        names |= sample_names(family, kind)
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


def substitute(expr: str, model: str, rate_interval: str) -> str:
    """Grafana's variables -> concrete PromQL, as Grafana does before it queries."""
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("${model}", model)
        .replace("$model", model)
    )


def wait_until(check, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not reached within {timeout_s}s (last: {last!r})")


@dataclass
class Process:
    proc: subprocess.Popen
    log: Path
    url: str

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, timeout_s: float = 15) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _spawn(cmd: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env_without_ferry(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def prometheus_config(targets: dict[str, str], rule_files: list[Path], scrape_s: float = 1) -> str:
    config = {
        "global": {"scrape_interval": f"{scrape_s}s", "evaluation_interval": f"{scrape_s}s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


@contextlib.contextmanager
def prometheus_server(
    targets: dict[str, str], workdir: Path, rule_files: list[Path] | None = None
) -> Iterator[Process]:
    """Our own Prometheus on loopback (never the Debian service): free port, temp data dir."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: run `bash tools/install_prometheus.sh`"
    port = free_port()
    config = workdir / f"prometheus-{port}.yml"
    config.write_text(prometheus_config(targets, rule_files or []))
    data = workdir / f"prometheus-data-{port}"
    log = workdir / f"prometheus-{port}.log"
    cmd = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    proc = _spawn(cmd, log, workdir)
    server = Process(proc, log, f"http://127.0.0.1:{port}")
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with {proc.returncode}:\n{server.log_tail()}"
                )
            return httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200

        wait_until(ready, 30, f"prometheus ready at {server.url}")
        yield server
    finally:
        server.stop()


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


def env_without_ferry() -> dict[str, str]:
    """The environment minus FERRY_* (the Makefile exports FERRY_HOST/PORT), for subprocesses."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
