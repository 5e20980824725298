"""Write Ferry's Grafana dashboards (overview, LLM, Triton) as JSON from the panel lists below.

The JSON under `dashboards/` is generated: edit this file, then run
`.venv/bin/python deploy/grafana/build_dashboards.py`; tests/deploy checks the two agree and that
every query uses only metrics Ferry (server/metrics.py) or Triton export.

Queries use `$model` (a multi-value variable, so always `=~`) and `$__rate_interval`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

DASHBOARD_DIR = Path(__file__).parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Ferry's own scrape traffic and probes are not traffic.
SERVED = 'endpoint!~"/metrics|/health/.*"'
M = 'model=~"$model"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[tuple[str, str], ...]  # (legend, PromQL)
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | heatmap
    width: int = 8
    description: str = ""
    extra: dict = field(default_factory=dict)


def quantiles(metric: str, selector: str, by: str = "") -> tuple[tuple[str, str], ...]:
    """p50/p95/p99 of a histogram, summed over instances."""
    group = f"le{', ' + by if by else ''}"
    prefix = f"{{{{{by}}}}} " if by else ""
    return tuple(
        (
            f"{prefix}p{q}",
            f"histogram_quantile(0.{q}, sum by ({group}) "
            f"(rate({metric}_bucket{{{selector}}}{RATE})))",
        )
        for q in ("50", "95", "99")
    )


def mean(metric: str, selector: str, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return (
        f"sum{group} (rate({metric}_sum{{{selector}}}{RATE}))"
        f" / sum{group} (rate({metric}_count{{{selector}}}{RATE}))"
    )


OVERVIEW = (
    Panel(
        "Models ready",
        (("{{model}}", f"sum by (model) (ferry_model_ready{{{M}}})"),),
        kind="stat",
        width=6,
        description="1 when the model is loaded, warm and its backend healthy.",
    ),
    Panel(
        "Ferry targets up",
        (("{{instance}}", 'up{job="ferry"}'),),
        kind="stat",
        width=6,
        description="Prometheus could scrape the instance.",
    ),
    Panel(
        "5xx ratio",
        (
            (
                "5xx / all",
                f'(sum(rate(ferry_requests_total{{status=~"5..", {SERVED}}}{RATE})) or vector(0))'
                f" / sum(rate(ferry_requests_total{{{SERVED}}}{RATE}))",
            ),
        ),
        unit="percentunit",
        kind="stat",
        width=6,
        description="Share of requests answered with a 5xx (alert: FerryHighErrorRate).",
    ),
    Panel(
        "Queue utilisation",
        (
            (
                "{{model}}",
                f"max by (model) (ferry_queue_depth{{{M}}} / ferry_queue_capacity{{{M}}})",
            ),
        ),
        unit="percentunit",
        kind="stat",
        width=6,
        description="Queue depth / bound (alert: FerryQueueSaturated at 80%).",
    ),
    Panel(
        "Requests/s",
        (
            (
                "{{endpoint}}",
                f"sum by (endpoint) (rate(ferry_requests_total{{{M}, {SERVED}}}{RATE}))",
            ),
        ),
        unit="reqps",
        description="Requests answered per second, any status, by route.",
    ),
    Panel(
        "Errors by status",
        (
            (
                "{{status}} {{endpoint}}",
                f'sum by (status, endpoint) (rate(ferry_requests_total{{status!~"2..", {SERVED}}}'
                f"{RATE}))",
            ),
        ),
        unit="reqps",
        description="Non-2xx responses per second (404s for unknown models carry no model).",
    ),
    Panel(
        "Rejections by reason",
        (("{{reason}}", f"sum by (reason) (rate(ferry_rejections_total{{{M}}}{RATE}))"),),
        unit="reqps",
        description="Requests the batcher refused: queue_full, predicted_late, deadline, invalid, "
        "cancelled, closed.",
    ),
    Panel(
        "Request latency",
        quantiles("ferry_request_duration_seconds", f"{M}, {SERVED}"),
        unit="s",
        description="Time from request received to response sent.",
    ),
    Panel(
        "Queue wait",
        quantiles("ferry_queue_wait_seconds", M),
        unit="s",
        description="Time a request waited in the batcher's queue before its batch left.",
    ),
    Panel(
        "Backend time per batch",
        quantiles("ferry_backend_inference_seconds", M, by="backend"),
        unit="s",
        description="Time the backend took to run one batch.",
    ),
    Panel(
        "Queue depth",
        (
            ("{{model}} depth", f"sum by (model) (ferry_queue_depth{{{M}}})"),
            ("{{model}} capacity", f"sum by (model) (ferry_queue_capacity{{{M}}})"),
        ),
        description="Requests waiting in the batcher's queue, and its bound.",
    ),
    Panel(
        "In-flight requests",
        (
            (
                "{{endpoint}}",
                'sum by (endpoint) (ferry_in_flight_requests{endpoint!~"/metrics|/health"})',
            ),
        ),
        description="HTTP requests being handled now, by path prefix.",
    ),
    Panel(
        "Batch size",
        (
            ("mean", mean("ferry_batch_size_requests", M)),
            *quantiles("ferry_batch_size_requests", M)[1:],
        ),
        description="Requests per dispatched batch (the heatmap shows the distribution).",
    ),
    Panel(
        "Batch size distribution",
        (
            (
                "{{le}}",
                f"sum by (le) (increase(ferry_batch_size_requests_bucket{{{M}}}{RATE}))",
            ),
        ),
        kind="heatmap",
        description="Batches per batch-size bucket.",
    ),
    Panel(
        "Padding ratio",
        (
            ("mean", mean("ferry_batch_padding_ratio", M)),
            *quantiles("ferry_batch_padding_ratio", M)[1:],
        ),
        unit="percentunit",
        description="Share of a batch's padded tokens that are padding (lower is better).",
    ),
    Panel(
        "Batches/s and padded tokens",
        (
            ("batches/s", f"sum(rate(ferry_batch_size_requests_count{{{M}}}{RATE}))"),
            ("mean padded tokens/batch", mean("ferry_batch_padded_tokens", M)),
        ),
        description="Dispatch rate and the mean padded size (batch x longest) of a batch.",
    ),
    Panel(
        "Backend failures/s",
        (
            (
                "{{backend}}",
                f"sum by (backend) (rate(ferry_backend_failures_total{{{M}}}{RATE}))",
            ),
        ),
        unit="ops",
        description="Batches whose backend call failed.",
    ),
    # Per GPU, from NVML (server/gpu_metrics.py); empty on hosts without a GPU.
    Panel(
        "GPU memory",
        (
            (
                "{{instance}} GPU {{gpu}} used",
                "max by (instance, gpu) (ferry_gpu_memory_used_bytes)",
            ),
            (
                "{{instance}} GPU {{gpu}} total",
                "max by (instance, gpu) (ferry_gpu_memory_total_bytes)",
            ),
        ),
        unit="bytes",
        width=12,
        description="Memory in use on each GPU (every process on it) and its total; "
        "FerryGpuMemoryNearLimit fires above 95%.",
    ),
    Panel(
        "GPU utilisation",
        (("{{instance}} GPU {{gpu}}", "max by (instance, gpu) (ferry_gpu_utilization_ratio)"),),
        unit="percentunit",
        width=12,
        description="Share of time a kernel ran on each GPU (NVML's sample period).",
    ),
)

LLM_M = 'model=~"$model"'
LLM = (
    Panel(
        "Time to first token",
        quantiles("ferry_llm_time_to_first_token_seconds", LLM_M),
        unit="s",
        description="From request received to the first generated token.",
    ),
    Panel(
        "Inter-token latency",
        quantiles("ferry_llm_inter_token_latency_seconds", LLM_M),
        unit="s",
        description="Time between consecutive generated tokens of one request.",
    ),
    Panel(
        "Request duration",
        quantiles("ferry_llm_request_duration_seconds", LLM_M),
        unit="s",
        description="From request received to the last token.",
    ),
    Panel(
        "Tokens/s",
        (
            ("prompt", f"sum(rate(ferry_llm_prompt_tokens_total{{{LLM_M}}}{RATE}))"),
            ("generation", f"sum(rate(ferry_llm_generation_tokens_total{{{LLM_M}}}{RATE}))"),
        ),
        description="Prompt tokens read and tokens generated per second.",
    ),
    Panel(
        "Requests running / waiting",
        (
            ("running", f"sum(ferry_llm_requests_running{{{LLM_M}}})"),
            ("waiting", f"sum(ferry_llm_requests_waiting{{{LLM_M}}})"),
        ),
        description="Requests generating now, and those queued for a slot.",
    ),
    Panel(
        "Finished requests/s by reason",
        (
            (
                "{{finish_reason}}",
                "sum by (finish_reason) "
                f"(rate(ferry_llm_requests_finished_total{{{LLM_M}}}{RATE}))",
            ),
        ),
        unit="reqps",
        description="stop, length, abort, error...",
    ),
    Panel(
        "Generated tokens per request",
        (
            (
                "mean",
                f"sum(rate(ferry_llm_generation_tokens_total{{{LLM_M}}}{RATE}))"
                f" / sum(rate(ferry_llm_requests_finished_total{{{LLM_M}}}{RATE}))",
            ),
        ),
        description="Mean completion length.",
    ),
    Panel(
        "Chat HTTP responses/s",
        (
            (
                "{{status}}",
                "sum by (status) (rate(ferry_requests_total"
                f'{{endpoint="/v1/chat/completions", {LLM_M}}}{RATE}))',
            ),
        ),
        unit="reqps",
        description="/v1/chat/completions responses by status code.",
    ),
    # LoRA adapters are served models of their own name: these split the load and latency by
    # it (base models and adapters alike; running/waiting above are per base engine).
    Panel(
        "Generated tokens/s by model or adapter",
        (
            (
                "{{model}}",
                f"sum by (model) (rate(ferry_llm_generation_tokens_total{{{LLM_M}}}{RATE}))",
            ),
        ),
        description="Tokens generated per second by each base model and each LoRA adapter.",
    ),
    Panel(
        "Time to first token p95 by model or adapter",
        (
            (
                "{{model}}",
                "histogram_quantile(0.95, sum by (le, model) "
                f"(rate(ferry_llm_time_to_first_token_seconds_bucket{{{LLM_M}}}{RATE})))",
            ),
        ),
        unit="s",
        description="Whether one adapter waits longer than the others for its first token.",
    ),
    Panel(
        "Finished requests/s by model or adapter",
        (
            (
                "{{model}}",
                f"sum by (model) (rate(ferry_llm_requests_finished_total{{{LLM_M}}}{RATE}))",
            ),
        ),
        unit="reqps",
        description="Request rate per base model and per LoRA adapter.",
    ),
)

T_M = 'model=~"$model"'


def per_request_ms(counter: str) -> str:
    """Triton's latencies are cumulative microsecond counters: per successful request, in ms.

    (Failures carry an extra `reason` label in recent Triton, so they are not added in here.)
    """
    return (
        f"sum by (model) (rate({counter}{{{T_M}}}{RATE}))"
        f" / sum by (model) (rate(nv_inference_request_success{{{T_M}}}{RATE})) / 1000"
    )


TRITON = (
    Panel(
        "Requests/s",
        (
            ("{{model}} ok", f"sum by (model) (rate(nv_inference_request_success{{{T_M}}}{RATE}))"),
            (
                "{{model}} failed",
                f"sum by (model) (rate(nv_inference_request_failure{{{T_M}}}{RATE}))",
            ),
        ),
        unit="reqps",
        description="Requests Triton answered (a batched request counts once).",
    ),
    Panel(
        "Inferences/s and executions/s",
        (
            ("{{model}} inferences", f"sum by (model) (rate(nv_inference_count{{{T_M}}}{RATE}))"),
            (
                "{{model}} executions",
                f"sum by (model) (rate(nv_inference_exec_count{{{T_M}}}{RATE}))",
            ),
        ),
        unit="ops",
        description="Items inferred and model executions (batches) per second.",
    ),
    Panel(
        "Mean batch size",
        (
            (
                "{{model}}",
                f"sum by (model) (rate(nv_inference_count{{{T_M}}}{RATE}))"
                f" / sum by (model) (rate(nv_inference_exec_count{{{T_M}}}{RATE}))",
            ),
        ),
        description="Inferences per execution: Triton's dynamic batching at work.",
    ),
    Panel(
        "Latency per request (mean)",
        (
            ("{{model}} total", per_request_ms("nv_inference_request_duration_us")),
            ("{{model}} queue", per_request_ms("nv_inference_queue_duration_us")),
            ("{{model}} compute", per_request_ms("nv_inference_compute_infer_duration_us")),
        ),
        unit="ms",
        description="Triton's latencies are cumulative counters, so means only.",
    ),
    Panel(
        "Compute breakdown (mean)",
        (
            ("{{model}} input", per_request_ms("nv_inference_compute_input_duration_us")),
            ("{{model}} infer", per_request_ms("nv_inference_compute_infer_duration_us")),
            ("{{model}} output", per_request_ms("nv_inference_compute_output_duration_us")),
        ),
        unit="ms",
        description="Time in the framework backend: input copy, inference, output copy.",
    ),
    Panel(
        "Pending requests",
        (("{{model}}", f"sum by (model) (nv_inference_pending_request_count{{{T_M}}})"),),
        description="Requests queued in Triton's scheduler.",
    ),
    Panel(
        "GPU utilisation",
        (("{{gpu_uuid}}", "nv_gpu_utilization"),),
        unit="percentunit",
        description="Per GPU, from DCGM (0-1).",
    ),
    Panel(
        "GPU memory",
        (
            ("{{gpu_uuid}} used", "nv_gpu_memory_used_bytes"),
            ("{{gpu_uuid}} total", "nv_gpu_memory_total_bytes"),
        ),
        unit="bytes",
        description="Per GPU, from DCGM.",
    ),
)


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    model_metric: str  # label_values() source for the $model variable
    panels: tuple[Panel, ...]


DASHBOARDS = (
    Dashboard(
        "ferry-overview",
        "Ferry / Overview",
        "Traffic, errors, latency and the micro-batcher of every model Ferry serves.",
        "ferry_model_ready",
        OVERVIEW,
    ),
    Dashboard(
        "ferry-llm",
        "Ferry / LLM",
        "Token-level latency and throughput of /v1/chat/completions, by model and LoRA adapter.",
        "ferry_llm_generation_tokens_total",  # adapters appear here, not in the engine gauges
        LLM,
    ),
    Dashboard(
        "ferry-triton",
        "Ferry / Triton",
        "Triton Inference Server behind Ferry: nv_inference_* and GPU metrics from :8002/metrics.",
        "nv_inference_request_success",
        TRITON,
    ),
)


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    height = 4 if panel.kind == "stat" else 8
    out = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
                **({"format": "heatmap"} if panel.kind == "heatmap" else {}),
            }
            for i, (legend, expr) in enumerate(panel.targets)
        ],
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
    }
    if panel.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    if panel.kind == "heatmap":
        out["options"] = {"calculate": False, "yAxis": {"unit": "short"}}
    out.update(panel.extra)
    return out


def dashboard_json(dash: Dashboard) -> dict:
    panels, x, y, row_h = [], 0, 0, 0
    for i, panel in enumerate(dash.panels, start=1):
        if x + panel.width > 24:
            x, y, row_h = 0, y + row_h, 0
        panels.append(panel_json(panel, i, x, y))
        height = panels[-1]["gridPos"]["h"]
        x, row_h = x + panel.width, max(row_h, height)
    return {
        "uid": dash.uid,
        "title": dash.title,
        "description": dash.description,
        "tags": ["ferry"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {"text": "Prometheus", "value": "prometheus"},
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": {
                        "query": f"label_values({dash.model_metric}, model)",
                        "refId": "model",
                    },
                    "definition": f"label_values({dash.model_metric}, model)",
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render_all() -> dict[str, str]:
    """File name -> JSON text, for every dashboard."""
    return {f"{d.uid}.json": json.dumps(dashboard_json(d), indent=2) + "\n" for d in DASHBOARDS}


def main() -> int:
    DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in render_all().items():
        (DASHBOARD_DIR / name).write_text(text)
        print(f"wrote {DASHBOARD_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
