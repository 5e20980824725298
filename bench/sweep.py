"""Sweep concurrency against one target: throughput, p50 and p99 at each level.

Every step is bounded: a fixed number of requests, or a fixed number of seconds, and a
step timeout on top so that a hung server ends the sweep instead of the benchmark hanging.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from ferry.bench.loadgen import LoadResult, run_load
from ferry.bench.targets import Target

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
BAR_WIDTH = 30


@dataclass(frozen=True)
class Budget:
    """How long one step runs: `seconds` when given, else `requests` requests."""

    requests: int = 300
    seconds: float | None = None
    timeout_s: float = 300.0


@dataclass(frozen=True)
class Step:
    concurrency: int
    completed: int
    throughput: float  # 200s per second
    p50_ms: float
    p99_ms: float
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return self.completed - self.statuses.get(200, 0)

    @classmethod
    def from_load(cls, concurrency: int, load: LoadResult) -> Step:
        return cls(
            concurrency,
            load.completed,
            load.throughput,
            load.percentile_ms(50),
            load.percentile_ms(99),
            dict(sorted(load.statuses.items())),
        )


def cycle(bodies: list[dict], count: int) -> list[dict]:
    """`count` bodies, going round the list as often as needed."""
    return [bodies[i % len(bodies)] for i in range(count)]


async def measure(target: Target, bodies: list[dict], concurrency: int, budget: Budget) -> Step:
    if budget.seconds is not None:
        load = run_load(target.base_url, bodies, concurrency, target.path, budget.seconds)
    else:
        load = run_load(target.base_url, cycle(bodies, budget.requests), concurrency, target.path)
    async with asyncio.timeout(budget.timeout_s):
        return Step.from_load(concurrency, await load)


async def sweep(
    target: Target,
    inputs: list[list[int]],
    concurrencies: tuple[int, ...] = DEFAULT_CONCURRENCY,
    budget: Budget = Budget(),
    warmup: int = 64,
    on_step: Callable[[Step], None] | None = None,
) -> list[Step]:
    """One step per concurrency level, in order, after a warm-up at the highest level."""
    bodies = target.bodies(inputs)
    if warmup:
        # First requests pay for lazy allocations and connection set-up; keep them out.
        await measure(target, bodies, max(concurrencies), Budget(warmup, None, budget.timeout_s))
    steps = []
    for concurrency in concurrencies:
        step = await measure(target, bodies, concurrency, budget)
        steps.append(step)
        if on_step is not None:
            on_step(step)
    return steps


def format_table(steps: list[Step], ceiling: float | None = None) -> str:
    """The table and, in its last column, the curve: throughput as a bar, its peak marked."""
    peak = max((s.throughput for s in steps), default=0.0)
    head = f"{'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
    if ceiling:
        head += f" {'% ceil':>6}"
    lines = [head + "  throughput", "-" * (len(head) + 2 + BAR_WIDTH + 7)]
    for s in steps:
        row = (
            f"{s.concurrency:>7} {s.throughput:8.1f} {s.p50_ms:8.1f} {s.p99_ms:8.1f} {s.errors:>6}"
        )
        if ceiling:
            row += f" {100 * s.throughput / ceiling:5.0f}%"
        bar = "#" * round(BAR_WIDTH * s.throughput / peak) if peak else ""
        mark = " <- peak" if peak and s.throughput == peak else ""
        lines.append(f"{row}  {bar:<{BAR_WIDTH}}{mark}".rstrip())
    return "\n".join(lines)
