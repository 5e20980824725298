"""Decode steps of onnxruntime-genai exports on a bare onnxruntime session, variant against variant.

    python -m ferry.bench.llm_int4 NAME=MODEL_DIR[:threads=N][:spin=US] ... [--batches 1 4]
                                   [--steps 48] [--rounds 4] [--context 40]

Each variant is a model folder (int4 block size, accuracy level, symmetric or not: what the
builder wrote) with session options: `threads=N` intra-op threads (default 0, one per core),
`spin=US` with pool threads spinning up to US microseconds before they sleep (Ferry serves
without). The sessions are Ferry's own
(llm/ortgenai_kv.KVModel), its KV cache bound in place as the batched lane binds it. Per round,
every variant in turn runs `--steps` decode steps per batch size after a `--context`-token
prompt in each row (A/B/A/B: a shared, noisy box drifts between rounds, not between variants).
Prints each variant's median tokens/s per batch size and its ratio to the first variant; for a
variant on one thread (which onnxruntime runs on the calling thread) also tokens per CPU-second
of that thread, which a busy box disturbs far less than the wall clock. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ferry.llm.ortgenai_kv import KVModel


@dataclass
class Variant:
    name: str
    model_dir: Path
    threads: int = 0
    spin_us: int = 0
    tok_s: dict[int, list[float]] = field(default_factory=dict)  # batch -> one per round
    tok_cpu_s: dict[int, list[float]] = field(default_factory=dict)  # the same, per CPU-second


def parse_variant(spec: str) -> Variant:
    """NAME=DIR[:threads=N][:spin=US]."""
    name, _, rest = spec.partition("=")
    if not name or not rest:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected NAME=MODEL_DIR[:threads=N][:spin=US]")
    path, *options = rest.split(":")
    variant = Variant(name, Path(path))
    for option in options:
        key, _, value = option.partition("=")
        if key == "spin" and value.isdigit():
            variant.spin_us = int(value)
        elif key == "threads" and value.isdigit():
            variant.threads = int(value)
        else:
            raise argparse.ArgumentTypeError(f"{spec!r}: unknown option {option!r}")
    if not (variant.model_dir / "genai_config.json").is_file():
        raise argparse.ArgumentTypeError(f"{variant.model_dir} has no genai_config.json")
    return variant


def decode_tok_s(model: KVModel, batch: int, context: int, steps: int) -> tuple[float, float]:
    """Tokens per second and per CPU-second of the calling thread of `steps` greedy decode
    steps of `batch` rows after a `context`-token prompt."""
    block = model.new_block(batch, context + steps + 1)
    rng = np.random.default_rng(0)
    tokens = np.zeros(batch, np.int64)
    for row in range(batch):
        ids = rng.integers(100, 10_000, context).tolist()
        tokens[row] = int(model.prefill(block, row, 0, ids).argmax())
    lengths = np.full(batch, context)
    model.forget_bindings()
    started, cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        tokens = model.decode(block, batch, lengths, tokens).argmax(axis=1)
        lengths += 1
    done = batch * steps
    return done / (time.perf_counter() - started), done / (time.thread_time() - cpu)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", type=parse_variant)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--context", type=int, default=40)
    args = parser.parse_args(argv)
    models = [KVModel(v.model_dir, v.threads, spin_us=v.spin_us) for v in args.variants]
    for model in models:  # warm-up: first-run allocations and prepacking
        decode_tok_s(model, max(args.batches), args.context, 4)
    for round_ in range(args.rounds):
        for variant, model in zip(args.variants, models, strict=True):
            for batch in args.batches:
                rate, cpu_rate = decode_tok_s(model, batch, args.context, args.steps)
                variant.tok_s.setdefault(batch, []).append(rate)
                variant.tok_cpu_s.setdefault(batch, []).append(cpu_rate)
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    report(args.variants, args.batches)


def report(variants: list[Variant], batches: list[int]) -> None:
    first = variants[0]
    header = " ".join(f"{f'b{b} tok/s':>9} {'ratio':>6} {f'b{b} tok/cpu-s':>13}" for b in batches)
    print(f"{'variant':>16} {header}")
    for variant in variants:
        cells = []
        for batch in batches:
            median = statistics.median(variant.tok_s[batch])
            ratio = median / statistics.median(first.tok_s[batch])
            cpu = statistics.median(variant.tok_cpu_s[batch]) if variant.threads == 1 else None
            cells.append(f"{median:9.1f} {ratio:5.2f}x {'-' if cpu is None else f'{cpu:.1f}':>13}")
        print(f"{variant.name:>16} " + " ".join(cells))


if __name__ == "__main__":
    main()
