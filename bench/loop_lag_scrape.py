"""A server's event-loop lag over a stretch of load, from two scrapes of its
`ferry_event_loop_lag_seconds` histogram (server/loop_lag.py): the wakes in between, and how many
ran later than each bound."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

LAG = "ferry_event_loop_lag_seconds"


def lag_buckets(url: str) -> dict[float, float]:
    """Cumulative wakes per upper bound (seconds), as scraped now, over every process."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples if family.name == LAG else ():
            if sample.name == f"{LAG}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def describe_lag(before: dict[float, float], after: dict[float, float]) -> str:
    """ "N wakes, later than 5 ms: k (x %), ..." between two scrapes."""
    wakes = after[float("inf")] - before.get(float("inf"), 0.0)
    if not wakes:
        return "no wakes timed"
    parts = []
    for bound in (0.005, 0.01, 0.02):
        late = wakes - (after[bound] - before.get(bound, 0.0))
        parts.append(f"later than {bound * 1000:.0f} ms {late:.0f} ({late / wakes:.1%})")
    return f"{wakes:.0f} wakes, " + ", ".join(parts)
