"""The in-process ONNX Runtime ceiling, kept cheap enough to print beside every benchmark.

`bench.inprocess.best_inprocess` tries five strategies; on 2 cores and mixed lengths that alone
takes about a minute, so the benchmarks try only the strategies that can win with two sessions
of one thread each (the server's own layout): batch 1, and small batches of sorted lengths.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from ferry.bench.inprocess import batch1_latencies_s, session, throughput

# (batch size, sort by length): batch 1 wins on long mixed inputs, batch 8 sorted on short ones.
WARMUP_RUNS = 10
STRATEGIES: tuple[tuple[int, bool], ...] = ((1, False), (8, True))


@dataclass(frozen=True)
class Ceiling:
    strategy: str
    seq_per_s: float
    figures: dict[str, float]


def ceiling(model: Path, inputs: list[list[int]], sessions: int = 2) -> Ceiling:
    """Best sequences per second over STRATEGIES on exactly these inputs."""
    pool = [session(model, 1) for _ in range(sessions)]
    throughput(pool, inputs[: WARMUP_RUNS * sessions], 1, sort=False)  # first runs allocate
    figures = {
        f"batch {size}{' sorted' if sort else ''}, {sessions} sessions x 1 thread": throughput(
            pool, inputs, size, sort
        )
        for size, sort in STRATEGIES
    }
    best = max(figures, key=figures.__getitem__)
    return Ceiling(best, figures[best], figures)


def batch1_p50_ms(model: Path, inputs: list[list[int]]) -> float:
    """Median latency of one unpadded call at a time: what a single request cannot beat."""
    sess = session(model, 2)
    # A fresh session's first runs allocate; the servers it is compared with are warmed up too.
    batch1_latencies_s(sess, inputs[:WARMUP_RUNS])
    return statistics.median(batch1_latencies_s(sess, inputs)) * 1000
