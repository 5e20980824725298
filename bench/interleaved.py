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
from pathlib import Path

from ferry.bench.inputs import token_sequences
from ferry.bench.loadgen import LoadResult, merge, run_load
from ferry.bench.peers import STEP_TIMEOUT_S, ferry_peer, unbatched_peer
from ferry.bench.server_process import DEFAULT_MODEL_DIR, default_model_config
from ferry.bench.sweep import Budget, Step, measure
from ferry.bench.targets import Target

FERRY, UNBATCHED = "ferry", "unbatched"

# Sends one block of inputs to the server of that name, closed loop: what it answered.
Send = Callable[[str, list[list[int]]], Awaitable[LoadResult]]


def block_order(round_index: int, names: Sequence[str]) -> list[str]:
    """Who goes first alternates, so neither always runs on the same side of a drift."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


async def interleave(
    names: Sequence[str], blocks: Sequence[list[list[int]]], send: Send
) -> dict[str, list[LoadResult]]:
    """Every block to every server, round by round, in `block_order`: each server's rounds."""
    rounds: dict[str, list[LoadResult]] = {name: [] for name in names}
    for index, block in enumerate(blocks):
        for name in block_order(index, names):
            rounds[name].append(await send(name, block))
    return rounds


def pooled(rounds: list[LoadResult], concurrency: int) -> Step:
    """A server's rounds as one step: the blocks ran one after another, so their times add."""
    return Step.from_load(concurrency, merge(rounds, elapsed=sum))


def report(
    rounds: dict[str, list[LoadResult]],
    steps: dict[str, Step],
    ferry: str = FERRY,
    peer: str = UNBATCHED,
) -> str:
    """The pooled steps, each server's rounds, and Ferry's ratios to the peer."""
    lines = [f"{'server':<10} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}  per round"]
    for name, step in steps.items():
        each = " ".join(f"{load.throughput:.1f}" for load in rounds[name])
        lines.append(
            f"{name:<10} {step.throughput:7.1f} {step.p50_ms:8.1f} {step.p99_ms:8.1f} "
            f"{step.errors:>6}  {each}"
        )
    mine, theirs = steps[ferry], steps[peer]
    ratios = " ".join(
        f"{a.throughput / b.throughput:.3f}"
        for a, b in zip(rounds[ferry], rounds[peer], strict=True)
        if b.throughput
    )
    lines.append(
        f"{ferry} / {peer}: {mine.throughput / theirs.throughput:.3f}x req/s, "
        f"p99 {mine.p99_ms / theirs.p99_ms:.3f}x "
        f"(p50 {mine.p50_ms / theirs.p50_ms:.3f}x); per round {ratios}"
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

        async def run() -> dict[str, list[LoadResult]]:
            for target in targets.values():
                warm = Budget(args.warmup, None, STEP_TIMEOUT_S)
                await measure(target, target.bodies(blocks[0]), args.concurrency, warm)
            return await interleave(list(targets), blocks, send)

        rounds = asyncio.run(run())
    print(
        f"{args.rounds} rounds of {args.requests} requests of {args.min_tokens}-{args.max_tokens}"
        f" tokens to each server, {args.concurrency} closed-loop clients, both servers up"
    )
    if args.batching:
        print(f"ferry's batching overrides: {json.dumps(args.batching, sort_keys=True)}")
    steps = {name: pooled(loads, args.concurrency) for name, loads in rounds.items()}
    print(report(rounds, steps))
    return 1 if any(step.errors for step in steps.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
