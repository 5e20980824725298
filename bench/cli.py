"""`ferry bench`: sweep concurrency against a running server, print the curve, plot it."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ferry.bench.targets import PROTOCOLS

DEFAULT_ONNX = (
    Path(__file__).resolve().parents[1] / "artifacts" / "models" / "all-MiniLM-L6-v2" / "model.onnx"
)
DESCRIPTION = """\
Sweep client concurrency against a running server and print, per level, throughput, p50 and
p99 latency, with the in-process ONNX Runtime figure on the same inputs as the ceiling. Each
client keeps one keep-alive connection and sends its next request when the last one is
answered (closed loop). Targets: Ferry's /predict (or any /predict-compatible server), or a
KServe v2 HTTP endpoint (Triton, or Ferry's /v2) with --protocol kserve --model NAME.
Timings on a machine shared with other work are noisy: compare figures from one run."""


def add_bench_command(subparsers: argparse._SubParsersAction, summary: str) -> None:
    """`ferry bench`, with its one-line help from ferry/cli.py (which lists it unloaded too)."""
    bench = subparsers.add_parser(
        "bench",
        help=summary,
        description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    target = bench.add_argument_group("target")
    target.add_argument(
        "--url",
        default="http://127.0.0.1:8000",
        help="Server to load, http://host:port; a path in the URL replaces the protocol's path.",
    )
    target.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="predict",
        help="predict: POST /predict {input_ids}; kserve: POST /v2/models/MODEL/infer with INT64 "
        "input_ids and attention_mask tensors, asking for sentence_embedding only.",
    )
    target.add_argument(
        "--model",
        default=None,
        help="Model name: required for kserve; sent as `model` with predict (else the default).",
    )
    load = bench.add_argument_group("load")
    load.add_argument(
        "--concurrency",
        type=_levels,
        default="1,2,4,8,16,32,64",
        help="Comma-separated numbers of concurrent clients, one step each, in this order.",
    )
    load.add_argument("--requests", type=_positive_int, default=300, help="Requests per step.")
    load.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="Run each step this many seconds instead of a fixed number of requests.",
    )
    load.add_argument(
        "--step-timeout",
        type=float,
        default=300.0,
        help="Abort the sweep if one step takes longer than this many seconds.",
    )
    load.add_argument(
        "--warmup",
        type=int,
        default=64,
        help="Requests sent at the highest concurrency before the first step (0: none).",
    )
    inputs = bench.add_argument_group("inputs (token id sequences of random lengths)")
    inputs.add_argument("--min-len", type=_positive_int, default=8, help="Shortest, in tokens.")
    inputs.add_argument("--max-len", type=_positive_int, default=128, help="Longest, in tokens.")
    inputs.add_argument("--seed", type=int, default=0, help="Seed of lengths and token ids.")
    output = bench.add_argument_group("ceiling and plot")
    output.add_argument(
        "--onnx",
        type=Path,
        default=DEFAULT_ONNX,
        help="ONNX model run in-process on the same inputs for the ceiling figure.",
    )
    output.add_argument("--no-onnx", action="store_true", help="Skip the in-process ceiling.")
    output.add_argument(
        "--plot",
        type=Path,
        default=Path("ferry-bench.png"),
        help="PNG to write: p50 and p99 latency against throughput.",
    )
    output.add_argument("--no-plot", action="store_true", help="Do not write the PNG.")
    bench.set_defaults(handler=run_bench)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 1,2,4,8, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"expected positive levels, got {text!r}")
    return levels


def run_bench(args: argparse.Namespace) -> int:
    from ferry.bench.inputs import token_sequences
    from ferry.bench.sweep import Budget, format_table, sweep
    from ferry.bench.targets import Target

    if args.min_len < 2 or args.max_len < args.min_len:
        print("error: need 2 <= --min-len <= --max-len ([CLS] and [SEP] count)", file=sys.stderr)
        return 2
    try:
        target = Target(args.url, args.protocol, args.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # With --seconds the bodies go round; 512 distinct ones keep lengths well mixed.
    count = args.requests if args.seconds is None else 512
    inputs = token_sequences(count, args.min_len, args.max_len, args.seed)
    budget = Budget(args.requests, args.seconds, args.step_timeout)
    per_step = f"{args.seconds:g} s" if args.seconds is not None else f"{args.requests} requests"
    print(
        f"target: {target.base_url}{target.path} ({target.protocol}); inputs: {count} sequences "
        f"of {args.min_len}-{args.max_len} tokens (seed {args.seed}); {per_step} per step"
    )
    ceiling = None if args.no_onnx else _ceiling(args.onnx, inputs)

    def progress(step) -> None:
        print(f"  {step.concurrency} clients: {step.throughput:.1f} req/s", file=sys.stderr)

    try:
        steps = asyncio.run(
            sweep(target, inputs, args.concurrency, budget, args.warmup, on_step=progress)
        )
    except TimeoutError:
        print(f"error: a step took over {args.step_timeout:g} s; stopped", file=sys.stderr)
        return 1
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        print(f"error: cannot benchmark {target.base_url}: {exc!r}", file=sys.stderr)
        return 1
    print(format_table(steps, ceiling))
    if ceiling:
        best = max(steps, key=lambda s: s.throughput)
        print(
            f"peak {best.throughput:.1f} req/s at {best.concurrency} clients = "
            f"{best.throughput / ceiling:.2f} x the in-process ceiling ({ceiling:.1f} seq/s)"
        )
    if not args.no_plot:
        from ferry.bench.plot import plot_latency_vs_throughput

        title = f"{target.base_url}{target.path}, {args.min_len}-{args.max_len} tokens"
        print(f"wrote {plot_latency_vs_throughput(steps, args.plot, title, ceiling)}")
    return 0


def _ceiling(model: Path, inputs: list[list[int]]) -> float | None:
    if not model.exists():
        print(f"in-process ceiling skipped: {model} does not exist (see --onnx)")
        return None
    from ferry.bench.ceiling import ceiling

    result = ceiling(model, inputs)
    for label, value in result.figures.items():
        print(f"  in-process ORT {label:40s} {value:8.1f} seq/s")
    print(f"ceiling: {result.seq_per_s:.1f} seq/s ({result.strategy})")
    return result.seq_per_s
