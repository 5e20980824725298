"""Ferry against the strong unbatched server in alternating blocks, both started at once.

`bench.peers` measures one server after the other. On a shared machine the speed drifts between
runs minutes apart: the same unbatched server measured 93.6 and 98.8 req/s under the mixed load
on the 2-core development box. That is more than the mixed-load difference the comparison has
to decide. Here both servers are up together, and each round sends the same block of inputs to
each in turn, the order alternating. The ratios come from the rounds pooled: throughput is all
answered requests over all the blocks' time, p50 and p99 are over all latencies. Each round's
own ratio is printed too, so the drift shows.

python -m ferry.bench.interleaved [--rounds 6] [--requests 500] [--min-tokens 8] [--max-tokens 128]
    [--batching JSON]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ferry.bench.inputs import token_sequences
from ferry.bench.loadgen import LoadResult, run_load
from ferry.bench.peers import STEP_TIMEOUT_S, ferry_peer, unbatched_peer
from ferry.bench.server_process import DEFAULT_MODEL_DIR, default_model_config
from ferry.bench.sweep import Budget, measure
from ferry.bench.targets import Target

FERRY, UNBATCHED = "ferry", "unbatched"

# Sends one block of inputs to the server of that name, closed loop: what it answered.
Send = Callable[[str, list[list[int]]], Awaitable[LoadResult]]


@dataclass
class Pooled:
    """One server's blocks together."""

    latencies_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    answered: int = 0  # 200s
    errors: int = 0
    per_round: list[float] = field(default_factory=list)  # each block's req/s

    def add(self, load: LoadResult) -> None:
        self.latencies_s += load.latencies_s
        self.elapsed_s += load.elapsed_s
        self.answered += load.statuses.get(200, 0)
        self.errors += load.completed - load.statuses.get(200, 0)
        self.per_round.append(load.throughput)

    @property
    def throughput(self) -> float:
        return self.answered / self.elapsed_s if self.elapsed_s else 0.0

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000) if self.latencies_s else 0.0


def block_order(round_index: int, names: Sequence[str]) -> list[str]:
    """Who goes first alternates, so neither always runs on the same side of a drift."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


async def interleave(
    names: Sequence[str], blocks: Sequence[list[list[int]]], send: Send
) -> dict[str, Pooled]:
    """Every block to every server, round by round, in `block_order`."""
    pooled = {name: Pooled() for name in names}
    for index, block in enumerate(blocks):
        for name in block_order(index, names):
            pooled[name].add(await send(name, block))
    return pooled


def report(pooled: dict[str, Pooled], ferry: str = FERRY, peer: str = UNBATCHED) -> str:
    mine, theirs = pooled[ferry], pooled[peer]
    lines = [f"{'server':<10} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}  per round"]
    for name, result in pooled.items():
        rounds = " ".join(f"{rate:.1f}" for rate in result.per_round)
        lines.append(
            f"{name:<10} {result.throughput:7.1f} {result.percentile_ms(50):8.1f} "
            f"{result.percentile_ms(99):8.1f} {result.errors:>6}  {rounds}"
        )
    each = " ".join(
        f"{a / b:.3f}" for a, b in zip(mine.per_round, theirs.per_round, strict=True) if b
    )
    lines.append(
        f"{ferry} / {peer}: {mine.throughput / theirs.throughput:.3f}x req/s, "
        f"p99 {mine.percentile_ms(99) / theirs.percentile_ms(99):.3f}x "
        f"(p50 {mine.percentile_ms(50) / theirs.percentile_ms(50):.3f}x); per round {each}"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=6, help="Blocks sent to each server.")
    parser.add_argument("--requests", type=int, default=500, help="Requests per block.")
    parser.add_argument("--min-tokens", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=64, help="Closed-loop clients.")
    parser.add_argument("--warmup", type=int, default=128, help="Requests to each before round 1.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument(
        "--batching",
        type=json.loads,
        default=None,
        help="Ferry's [models.batching] overrides as JSON, e.g. '{\"fairness_window\": 0}'.",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    inputs = token_sequences(
        args.rounds * args.requests, args.min_tokens, args.max_tokens, args.seed
    )
    blocks = [inputs[i : i + args.requests] for i in range(0, len(inputs), args.requests)]
    with contextlib.ExitStack() as stack:
        targets: dict[str, Target] = {
            FERRY: stack.enter_context(
                ferry_peer(default_model_config(batching=args.batching))
            ).target,
            UNBATCHED: stack.enter_context(unbatched_peer(args.model_dir)).target,
        }

        async def send(name: str, block: list[list[int]]) -> LoadResult:
            target = targets[name]
            load = run_load(target.base_url, target.bodies(block), args.concurrency, target.path)
            async with asyncio.timeout(STEP_TIMEOUT_S):
                return await load

        async def run() -> dict[str, Pooled]:
            for target in targets.values():
                warm = Budget(args.warmup, None, STEP_TIMEOUT_S)
                await measure(target, target.bodies(blocks[0]), args.concurrency, warm)
            return await interleave(list(targets), blocks, send)

        pooled = asyncio.run(run())
    print(
        f"{args.rounds} rounds of {args.requests} requests of {args.min_tokens}-{args.max_tokens}"
        f" tokens to each server, {args.concurrency} closed-loop clients, both servers up"
    )
    if args.batching:
        print(f"ferry's batching overrides: {json.dumps(args.batching, sort_keys=True)}")
    print(report(pooled))
    return 1 if any(result.errors for result in pooled.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
