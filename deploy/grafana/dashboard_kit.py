"""What the dashboards are made of: the Panel type, PromQL helpers, and Ferry's metric names.

Ferry's names are read from server/metrics.py's own definitions (`ferry_metric`), so a renamed
metric changes the dashboards with it instead of leaving a query that finds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ferry.server.metrics import FerryMetrics

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Ferry's own scrape traffic and probes are not traffic.
SERVED = 'endpoint!~"/metrics|/health/.*"'
M = 'model=~"$model"'
RATE = "[$__rate_interval]"

_FERRY = FerryMetrics()


def ferry_metric(attribute: str) -> str:
    """The series name of `FerryMetrics.<attribute>` as PromQL selects it.

    A counter's ends in `_total`; a histogram's takes `_bucket`, `_sum` or `_count` in the query.
    """
    (family,) = getattr(_FERRY, attribute).describe()
    return f"{family.name}_total" if family.type == "counter" else family.name


# Every Ferry series the dashboards query, by its FerryMetrics attribute.
MODEL_READY = ferry_metric("model_ready")
REQUESTS = ferry_metric("requests")
REQUEST_DURATION = ferry_metric("request_duration")
IN_FLIGHT = ferry_metric("in_flight")
REJECTIONS = ferry_metric("rejections")
CONNECTIONS_REFUSED = ferry_metric("connections_refused")
QUEUE_WAIT = ferry_metric("queue_wait")
QUEUE_DEPTH = ferry_metric("queue_depth")
QUEUE_CAPACITY = ferry_metric("queue_capacity")
BATCH_SIZE = ferry_metric("batch_size")
BATCH_TOKENS = ferry_metric("batch_tokens")
PADDING_RATIO = ferry_metric("padding_ratio")
BACKEND_DURATION = ferry_metric("backend_duration")
BACKEND_FAILURES = ferry_metric("backend_failures")
GC_PAUSE = ferry_metric("gc_pause")
GC_FROZEN = ferry_metric("gc_frozen_objects")
LOOP_LAG = ferry_metric("event_loop_lag")
# The LLM path (server/openai/observer.py observes these).
TTFT = ferry_metric("llm_ttft")
ITL = ferry_metric("llm_itl")
DURATION = ferry_metric("llm_duration")
PROMPT_TOKENS = ferry_metric("llm_prompt_tokens")
GENERATION_TOKENS = ferry_metric("llm_generation_tokens")
FINISHED = ferry_metric("llm_finished")
RUNNING = ferry_metric("llm_running")
WAITING = ferry_metric("llm_waiting")
STRUCTURED = ferry_metric("llm_structured")
GUIDED_ITL = ferry_metric("llm_guided_itl")
CACHE_QUERIES = ferry_metric("llm_prefix_cache_queries")
CACHE_HITS = ferry_metric("llm_prefix_cache_hits")
KV_USAGE = ferry_metric("llm_kv_cache_usage")
SPEC_DRAFTED = ferry_metric("llm_spec_draft_tokens")
SPEC_ACCEPTED = ferry_metric("llm_spec_accepted_tokens")
LORA_INFO = ferry_metric("llm_lora_info")


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[tuple[str, str], ...]  # (legend, PromQL)
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | heatmap
    width: int = 8
    description: str = ""
    extra: dict = field(default_factory=dict)
    # Show the series' exemplars (a sampled request's trace id, Ferry's tracing): a slow point
    # links to its trace through the data source's exemplarTraceIdDestinations.
    exemplars: bool = False


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


def rate_by(by: str, metric: str, selector: str = M) -> str:
    """Per-second rate of a counter, summed by `by` (empty: over everything)."""
    total = f"sum by ({by}) " if by else "sum"
    return f"{total}(rate({metric}{{{selector}}}{RATE}))"


def rate_panel(
    title: str,
    by: str,
    metric: str,
    description: str,
    *,
    selector: str = M,
    unit: str = "reqps",
    legend: str = "",
) -> Panel:
    """One series per value of the label `by`: a counter's per-second rate (the common panel)."""
    series = ((legend or f"{{{{{by}}}}}", rate_by(by, metric, selector)),)
    return Panel(title, series, unit=unit, description=description)
