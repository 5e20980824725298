"""Ferry /predict vs in-process ONNX Runtime on the same inputs, ratios printed from one run.

python -m ferry.bench.predict_load [--requests 2000] [--concurrency 64] [--min-len 8 --max-len 128]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from ferry.backends.ort_session import cpu_session
from ferry.bench.inprocess import batch1_latencies_s, best_inprocess
from ferry.bench.inputs import token_sequences
from ferry.bench.loadgen import run_load
from ferry.bench.server_process import DEFAULT_MODEL_DIR, default_model_config, ferry_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model = DEFAULT_MODEL_DIR / "model.onnx"
    inputs = token_sequences(args.requests, args.min_len, args.max_len, args.seed)
    bodies = [{"input_ids": ids} for ids in inputs]
    print(
        f"inputs: {args.requests} sequences of {args.min_len}-{args.max_len} tokens, "
        f"{args.concurrency} concurrent clients"
    )

    name, best, figures = best_inprocess(model, inputs)
    for label, value in figures.items():
        print(f"  in-process {label:42s} {value:8.1f} seq/s")
    single = cpu_session(model, 2)
    floor_ms = statistics.median(batch1_latencies_s(single, inputs[:200])) * 1000
    print(f"  in-process batch-1 latency p50 {floor_ms:.2f} ms")

    with ferry_server([default_model_config()]) as server:
        asyncio.run(run_load(server.url, bodies[:200], args.concurrency))  # warm-up
        loaded = asyncio.run(run_load(server.url, bodies, args.concurrency))
        serial = asyncio.run(run_load(server.url, bodies[:200], 1))
    print(f"ferry, concurrency {args.concurrency}: {loaded.summary()}")
    print(f"ferry, concurrency 1:  {serial.summary()}")
    print(f"ratio ferry / in-process best ({name}): {loaded.throughput / best:.2f}")
    print(
        f"p50 at concurrency 1: ferry {serial.percentile_ms(50):.2f} ms vs in-process batch-1 "
        f"{floor_ms:.2f} ms (+{serial.percentile_ms(50) - floor_ms:.2f} ms)"
    )


if __name__ == "__main__":
    main()
