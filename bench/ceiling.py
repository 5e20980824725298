"""The in-process ONNX Runtime ceiling, printed beside every benchmark.

Batch 1, 8, 16 and 32, each in arrival order and sorted by length, on one 1-thread session per
core (the server's own layout); the best is the ceiling. On 2 cores each strategy costs seconds.
Batch 1 sorted is the same work as batch 1 unsorted, so it is tried once.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from ferry.backends.ort_session import cpu_session
from ferry.bench.inprocess import batch1_latencies_s, throughput

WARMUP_RUNS = 10
BATCH_SIZES = (1, 8, 16, 32)
STRATEGIES: tuple[tuple[int, bool], ...] = tuple(
    (size, sort) for size in BATCH_SIZES for sort in (False, True) if size > 1 or not sort
)


@dataclass(frozen=True)
class Ceiling:
    strategy: str
    seq_per_s: float
    figures: dict[str, float]


def ceiling(model: Path, inputs: list[list[int]], sessions: int | None = None) -> Ceiling:
    """Best sequences per second over STRATEGIES on exactly these inputs."""
    sessions = sessions or os.cpu_count() or 1
    pool = [cpu_session(model, 1) for _ in range(sessions)]
    throughput(pool, inputs[: WARMUP_RUNS * sessions], 1, sort=False)  # first runs allocate
    figures = {
        f"batch {size}{' sorted' if sort else ''}, {sessions} sessions x 1 thread": throughput(
            pool, inputs, size, sort
        )
        for size, sort in STRATEGIES
    }
    best = max(figures, key=figures.__getitem__)
    return Ceiling(best, figures[best], figures)


def batch1_p50_ms(model: Path, inputs: list[list[int]], threads: int | None = None) -> float:
    """Median latency of one unpadded call at a time on a session of `threads` threads."""
    sess = cpu_session(model, threads or os.cpu_count() or 1)
    # A fresh session's first runs allocate; the servers it is compared with are warmed up too.
    batch1_latencies_s(sess, inputs[:WARMUP_RUNS])
    return statistics.median(batch1_latencies_s(sess, inputs)) * 1000
