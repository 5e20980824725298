"""Ferry / Overview: traffic, errors, latency and the micro-batcher of every model."""

from __future__ import annotations

from dashboard_kit import (
    BACKEND_DURATION,
    BACKEND_FAILURES,
    BATCH_SIZE,
    BATCH_TOKENS,
    CONNECTIONS_REFUSED,
    GC_FROZEN,
    GC_PAUSE,
    IN_FLIGHT,
    LOOP_LAG,
    MODEL_READY,
    PADDING_RATIO,
    QUEUE_CAPACITY,
    QUEUE_DEPTH,
    QUEUE_WAIT,
    RATE,
    REJECTIONS,
    REQUEST_DURATION,
    REQUESTS,
    SERVED,
    M,
    Panel,
    mean,
    quantiles,
    rate_by,
    rate_panel,
)

from ferry.server.gpu_metrics import MEMORY_TOTAL, MEMORY_USED, UTILIZATION

OVERVIEW = (
    Panel(
        "Models ready",
        (("{{model}}", f"sum by (model) ({MODEL_READY}{{{M}}})"),),
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
                f'(sum(rate({REQUESTS}{{status=~"5..", {SERVED}}}{RATE})) or vector(0))'
                f" / sum(rate({REQUESTS}{{{SERVED}}}{RATE}))",
            ),
        ),
        unit="percentunit",
        kind="stat",
        width=6,
        description="Share of requests answered with a 5xx (alert: FerryHighErrorRate).",
    ),
    Panel(
        "Queue utilisation",
        (("{{model}}", f"max by (model) ({QUEUE_DEPTH}{{{M}}} / {QUEUE_CAPACITY}{{{M}}})"),),
        unit="percentunit",
        kind="stat",
        width=6,
        description="Queue depth / bound (alert: FerryQueueSaturated at 80%).",
    ),
    rate_panel(
        "Requests/s",
        "endpoint",
        REQUESTS,
        "Requests answered per second, any status, by route.",
        selector=f"{M}, {SERVED}",
    ),
    rate_panel(
        "Errors by status",
        "status, endpoint",
        REQUESTS,
        "Non-2xx responses per second (404s for unknown models carry no model).",
        selector=f'status!~"2..", {SERVED}',
        legend="{{status}} {{endpoint}}",
    ),
    Panel(
        "Rejections by reason",
        (
            ("{{reason}}", rate_by("reason", REJECTIONS)),
            # No model label: refused before a request, let alone its model, was read.
            ("connection {{reason}}", rate_by("reason", CONNECTIONS_REFUSED, "")),
        ),
        unit="reqps",
        description="Requests the batcher refused: queue_full, predicted_late, deadline, invalid, "
        "cancelled, closed; and connections refused at the socket: too_many_connections (503), "
        "header_timeout / body_timeout (408), header_too_large (431).",
    ),
    Panel(
        "Request latency",
        quantiles(REQUEST_DURATION, f"{M}, {SERVED}"),
        unit="s",
        description="Time from request received to response sent. With tracing on, the dots are "
        "exemplars: sampled requests, each linking to its trace.",
        exemplars=True,
    ),
    Panel(
        "Queue wait",
        quantiles(QUEUE_WAIT, M),
        unit="s",
        description="Time a request waited in the batcher's queue before its batch left.",
    ),
    Panel(
        "Queue wait p95 by priority",
        (
            (
                "priority {{priority}}",
                f"histogram_quantile(0.95, sum by (le, priority) "
                f"(rate({QUEUE_WAIT}_bucket{{{M}}}{RATE})))",
            ),
        ),
        unit="s",
        description="Lower priority numbers are served first; levels outside the configured "
        "list (`priority_levels`) count as other.",
    ),
    Panel(
        "Backend time per batch",
        quantiles(BACKEND_DURATION, M, by="backend"),
        unit="s",
        description="Time the backend took to run one batch.",
    ),
    Panel(
        "Queue depth",
        (
            ("{{model}} depth", f"sum by (model) ({QUEUE_DEPTH}{{{M}}})"),
            ("{{model}} capacity", f"sum by (model) ({QUEUE_CAPACITY}{{{M}}})"),
        ),
        description="Requests waiting in the batcher's queue, and its bound.",
    ),
    Panel(
        "In-flight requests",
        (
            (
                "{{endpoint}}",
                f'sum by (endpoint) ({IN_FLIGHT}{{endpoint!~"/metrics|/health"}})',
            ),
        ),
        description="HTTP requests being handled now, by path prefix.",
    ),
    Panel(
        "Batch size",
        (("mean", mean(BATCH_SIZE, M)), *quantiles(BATCH_SIZE, M)[1:]),
        description="Requests per dispatched batch (the heatmap shows the distribution).",
    ),
    Panel(
        "Batch size distribution",
        (("{{le}}", f"sum by (le) (increase({BATCH_SIZE}_bucket{{{M}}}{RATE}))"),),
        kind="heatmap",
        description="Batches per batch-size bucket.",
    ),
    Panel(
        "Padding ratio",
        (("mean", mean(PADDING_RATIO, M)), *quantiles(PADDING_RATIO, M)[1:]),
        unit="percentunit",
        description="Share of a batch's padded tokens that are padding (lower is better).",
    ),
    Panel(
        "Batches/s and padded tokens",
        (
            ("batches/s", rate_by("", f"{BATCH_SIZE}_count")),
            ("mean padded tokens/batch", mean(BATCH_TOKENS, M)),
        ),
        description="Dispatch rate and the mean padded size (batch x longest) of a batch.",
    ),
    rate_panel(
        "Backend failures/s",
        "backend",
        BACKEND_FAILURES,
        "Batches whose backend call failed.",
        unit="ops",
    ),
    Panel(
        "Garbage-collector pauses",
        quantiles(GC_PAUSE, "", by="generation")[1:],
        unit="s",
        description="Each collection stops the event loop and the threads that start batches. "
        "The start-up heap is frozen once the models are up, so generation 2 stays short "
        "(server/gc_pauses.py).",
    ),
    Panel(
        "Event-loop lag",
        quantiles(LOOP_LAG, "", by="process"),
        unit="s",
        description="How late the serving processes' event loops ran a timer that was due: what "
        "a request, probe or batch arriving then waited before its loop got to it, by process "
        "(server, api, replica, engine; server/loop_lag.py).",
    ),
    Panel(
        "Frozen start-up objects",
        (("fewest of any process", f"min({GC_FROZEN})"),),
        kind="stat",
        width=6,
        description="Objects frozen out of the collector's walks at start-up; 0: a serving "
        "process has not frozen its heap, and its full collections walk all of it.",
    ),
    # Per GPU, from NVML (server/gpu_metrics.py); empty on hosts without a GPU.
    Panel(
        "GPU memory",
        (
            ("{{instance}} GPU {{gpu}} used", f"max by (instance, gpu) ({MEMORY_USED})"),
            ("{{instance}} GPU {{gpu}} total", f"max by (instance, gpu) ({MEMORY_TOTAL})"),
        ),
        unit="bytes",
        width=12,
        description="Memory in use on each GPU (every process on it) and its total; "
        "FerryGpuMemoryNearLimit fires above 95%.",
    ),
    Panel(
        "GPU utilisation",
        (("{{instance}} GPU {{gpu}}", f"max by (instance, gpu) ({UTILIZATION})"),),
        unit="percentunit",
        width=12,
        description="Share of time a kernel ran on each GPU (NVML's sample period).",
    ),
)
