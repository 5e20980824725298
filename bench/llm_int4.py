"""Decode steps of onnxruntime-genai exports on a bare onnxruntime session, variant against variant.

    python -m ferry.bench.llm_int4 NAME=MODEL_DIR[:threads=N][:spin] ... [--batches 1 4]
                                   [--steps 48] [--rounds 4] [--context 40]

Each variant is a model folder (int4 block size, accuracy level, symmetric or not: what the
builder wrote) with session options: `threads=N` intra-op threads (default 0, one per core),
`spin` with pool threads left spinning (Ferry serves without). The sessions are Ferry's own
(llm/ortgenai_kv.KVModel), its KV cache bound in place as the batched lane binds it. Per round,
every variant in turn runs `--steps` decode steps per batch size after a `--context`-token
prompt in each row (A/B/A/B: a shared, noisy box drifts between rounds, not between variants).
Prints each variant's median tokens/s per batch size and its ratio to the first variant.
Not part of `make test`.
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
    spinning: bool = False
    tok_s: dict[int, list[float]] = field(default_factory=dict)  # batch -> one per round


def parse_variant(spec: str) -> Variant:
    """NAME=DIR[:threads=N][:spin]."""
    name, _, rest = spec.partition("=")
    if not name or not rest:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected NAME=MODEL_DIR[:threads=N][:spin]")
    path, *options = rest.split(":")
    variant = Variant(name, Path(path))
    for option in options:
        if option == "spin":
            variant.spinning = True
        elif option.startswith("threads="):
            variant.threads = int(option.removeprefix("threads="))
        else:
            raise argparse.ArgumentTypeError(f"{spec!r}: unknown option {option!r}")
    if not (variant.model_dir / "genai_config.json").is_file():
        raise argparse.ArgumentTypeError(f"{variant.model_dir} has no genai_config.json")
    return variant


def decode_tok_s(model: KVModel, batch: int, context: int, steps: int) -> float:
    """Tokens/s of `steps` greedy decode steps of `batch` rows after a `context`-token prompt."""
    block = model.new_block(batch, context + steps + 1)
    rng = np.random.default_rng(0)
    tokens = np.zeros(batch, np.int64)
    for row in range(batch):
        ids = rng.integers(100, 10_000, context).tolist()
        tokens[row] = int(model.prefill(block, row, 0, ids).argmax())
    lengths = np.full(batch, context)
    model.forget_bindings()
    started = time.perf_counter()
    for _ in range(steps):
        tokens = model.decode(block, batch, lengths, tokens).argmax(axis=1)
        lengths += 1
    return batch * steps / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", type=parse_variant)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--context", type=int, default=40)
    args = parser.parse_args(argv)
    models = [KVModel(v.model_dir, v.threads, allow_spinning=v.spinning) for v in args.variants]
    for model in models:  # warm-up: first-run allocations and prepacking
        decode_tok_s(model, max(args.batches), args.context, 4)
    for round_ in range(args.rounds):
        for variant, model in zip(args.variants, models, strict=True):
            for batch in args.batches:
                rate = decode_tok_s(model, batch, args.context, args.steps)
                variant.tok_s.setdefault(batch, []).append(rate)
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)
    first = args.variants[0]
    header = " ".join(f"{f'batch {b} tok/s':>14} {'ratio':>6}" for b in args.batches)
    print(f"{'variant':>16} {header}")
    for variant in args.variants:
        cells = []
        for batch in args.batches:
            median = statistics.median(variant.tok_s[batch])
            ratio = median / statistics.median(first.tok_s[batch])
            cells.append(f"{median:14.1f} {ratio:5.2f}x")
        print(f"{variant.name:>16} " + " ".join(cells))


if __name__ == "__main__":
    main()
