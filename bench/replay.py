"""Replay closed-loop load through the real MicroBatcher on a virtual clock: deterministic verdicts.

The batcher is Ferry's own (admission, collection, dispatch, the online cost model, calibrated
as the server calibrates it); only the backend is simulated: a batch of n sequences padded to L
tokens takes the time `replay_costs.json` says (a 1-thread ONNX Runtime session of MiniLM,
measured once: bench/replay_costs.py), on one of SLOTS sessions side by side, as the server runs
them on 2 cores. HTTP and the event loop's own CPU are left out, for every policy alike.

Policies, all on the same requests:
  ferry      BatchLimits() as served: length grouping in the fairness window, the cost model's cut
  no-window  ferry with fairness_window None: length neighbours from the whole queue
  fifo       batches in arrival order, as full as the limits allow (no grouping, no cost model,
             so no fairness window either: arrival order passes nobody over)
  fcfs       one request at a time, first come first served: the strong unbatched server
  window=W   ferry with fairness_window W (--fairness-window W ..., a sweep)

Workloads: mixed (8-128 tokens) and short (8-16), N closed-loop clients (each sends its next
request when the last one is answered). The first and last N completions (ramp up, drain) are
left out of the figures. With --urgent-every K, every K-th request is sent with priority -10 (by
whichever client sends it) and the ratio of their median latency to the others' is printed.
(Urgent *clients* would not do: strict priorities let as many urgent closed-loop clients as
there are batch slots starve the rest, as documented.)

python -m ferry.bench.replay [--clients 64] [--requests 3000] [--fairness-window 0 0.5 ...]
    [--urgent-every 20] [--costs bench/replay_costs.json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ferry.batcher import BatchLimits, MicroBatcher, SequenceLimits, TokenSequence
from ferry.batcher.padding import PaddedBatch
from ferry.bench.replay_costs import DEFAULT_TABLE, CostTable
from ferry.bench.virtual_clock import VirtualClock

SLOTS = 2  # ONNX Runtime sessions side by side: one 1-thread session per core of the 2-core box
WORKLOADS = {"mixed": (8, 128), "short": (8, 16)}
URGENT = -10
SEQUENCE_LIMITS = SequenceLimits(max_length=512, vocab_size=30522)


def policies(windows: list[float]) -> dict[str, BatchLimits]:
    ferry = BatchLimits(max_concurrent_batches=SLOTS)
    named = {
        "fcfs": BatchLimits(max_batch_size=1, max_concurrent_batches=SLOTS),
        "fifo": replace(ferry, group_by_length=False, cost_model_batching=False),
        "ferry": ferry,
        "no-window": replace(ferry, fairness_window=None),
    }
    for window in windows:
        named[f"window={window:g}"] = replace(ferry, fairness_window=window)
    return named


@dataclass(frozen=True)
class Completion:
    priority: int
    length: int
    finished_at: float
    latency_s: float


@dataclass(frozen=True)
class Figures:
    req_per_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    mean_batch: float
    urgent_ratio: float | None  # priority -10's median over the others'


class SimulatedBackend:
    """Each batch takes the cost table's time for its padded shape, in the clock's time."""

    def __init__(self, clock: VirtualClock, costs: CostTable) -> None:
        self.clock = clock
        self.costs = costs
        self.sizes: list[int] = []

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        self.sizes.append(batch.size)
        await self.clock.sleep(self.costs(batch.size, batch.padded_length))
        return {"sentence_embedding": np.zeros((batch.size, 1), dtype=np.float32)}


async def closed_loop(
    limits: BatchLimits,
    costs: CostTable,
    lengths: list[int],
    clients: int,
    urgent_every: int,
    clock: VirtualClock,
) -> tuple[list[Completion], list[int]]:
    backend = SimulatedBackend(clock, costs)
    batcher = MicroBatcher("replay", backend.infer, limits, SEQUENCE_LIMITS, clock=clock)
    await batcher.calibrate()  # as the server does before it serves
    backend.sizes.clear()
    batcher.start()
    inputs = {n: TokenSequence.from_ids([1] * n) for n in set(lengths)}
    queue = iter(enumerate(lengths))
    done: list[Completion] = []

    async def client() -> None:
        for index, length in queue:
            priority = URGENT if urgent_every and index % urgent_every == urgent_every - 1 else 0
            sent = clock.time()
            (future,) = batcher.submit([inputs[length]], priority=priority)
            await future
            done.append(Completion(priority, length, clock.time(), clock.time() - sent))

    await asyncio.gather(*(client() for _ in range(clients)))
    await batcher.close(0)
    return done, backend.sizes


def figures(done: list[Completion], sizes: list[int], clients: int) -> Figures:
    steady = sorted(done, key=lambda c: c.finished_at)[clients:-clients]
    span = steady[-1].finished_at - steady[0].finished_at
    ms = np.array([c.latency_s for c in steady]) * 1000
    urgent = [c.latency_s for c in steady if c.priority == URGENT]
    background = [c.latency_s for c in steady if c.priority != URGENT]
    ratio = statistics.median(urgent) / statistics.median(background) if urgent else None
    return Figures(
        # Completions after the first instant, over the time they took.
        req_per_s=sum(c.finished_at > steady[0].finished_at for c in steady) / span,
        p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)),
        max_ms=float(ms.max()),
        mean_batch=float(np.mean(sizes)),
        urgent_ratio=ratio,
    )


def replay(
    limits: BatchLimits,
    costs: CostTable,
    workload: str,
    requests: int,
    clients: int,
    urgent_every: int = 0,
) -> Figures:
    low, high = WORKLOADS[workload]
    lengths = np.random.default_rng(0).integers(low, high + 1, size=requests).tolist()

    async def main() -> Figures:
        clock = VirtualClock()
        run = closed_loop(limits, costs, lengths, clients, urgent_every, clock)
        done, sizes = await clock.run(run)
        return figures(done, sizes, clients)

    return asyncio.run(main())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--workload", choices=[*WORKLOADS, "both"], default="both")
    parser.add_argument("--fairness-window", type=float, nargs="*", default=[])
    parser.add_argument("--urgent-every", type=int, default=0)
    parser.add_argument("--costs", type=Path, default=DEFAULT_TABLE)
    args = parser.parse_args(argv)
    costs = CostTable.load(args.costs)
    workloads = list(WORKLOADS) if args.workload == "both" else [args.workload]
    for workload in workloads:
        print(f"{workload} {WORKLOADS[workload]} tokens, {args.clients} closed-loop clients")
        base: Figures | None = None
        for name, limits in policies(args.fairness_window).items():
            result = replay(limits, costs, workload, args.requests, args.clients, args.urgent_every)
            base = base or result  # fcfs comes first: the others are read against it
            print(f"  {name:12s} {describe(result, base)}")


def describe(result: Figures, base: Figures) -> str:
    urgent = "" if result.urgent_ratio is None else f"  urgent/bg p50 {result.urgent_ratio:.2f}"
    return (
        f"{result.req_per_s:6.1f} req/s ({result.req_per_s / base.req_per_s:4.2f}x)"
        f"  p50 {result.p50_ms:7.1f}  p99 {result.p99_ms:7.1f} ms"
        f" ({result.p99_ms / base.p99_ms:4.2f}x)  max {result.max_ms:7.1f}"
        f"  batch {result.mean_batch:4.1f}{urgent}"
    )


if __name__ == "__main__":
    main()
