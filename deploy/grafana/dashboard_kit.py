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


def rate_by(by: str, metric: str, selector: str = M) -> str:
    """Per-second rate of a counter, summed by `by` (empty: over everything)."""
    total = f"sum by ({by}) " if by else "sum"
    return f"{total}(rate({metric}{{{selector}}}{RATE}))"
