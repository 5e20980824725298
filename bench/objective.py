"""Does a p99 latency objective hold? Open-loop load at fractions of measured saturation.

    python -m ferry.bench.objective [--objective-ms 250] [--seconds 15]

Saturation is measured first (64 closed-loop clients); then requests arrive on a fixed schedule
at 20 %, 50 % and 80 % of it, against Ferry with `batching.latency_objective_s` set, and p99 is
printed beside the objective.
"""

from __future__ import annotations

import argparse
import asyncio

from ferry.bench.inputs import token_sequences
from ferry.bench.loadgen import run_load
from ferry.bench.server_process import default_model_config, ferry_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objective-ms", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=15.0, help="per load level")
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=128)
    args = parser.parse_args()
    bodies = [{"input_ids": ids} for ids in token_sequences(2000, args.min_len, args.max_len, 1)]
    config = default_model_config(batching={"latency_objective_s": args.objective_ms / 1000})
    with ferry_server([config]) as server:
        saturation = asyncio.run(run_load(server.url, bodies[:1000], 64)).throughput
        print(f"saturation: {saturation:.1f} req/s; objective p99 <= {args.objective_ms:.0f} ms")
        for share in (0.2, 0.5, 0.8):
            rate = share * saturation
            result = asyncio.run(
                run_load(server.url, bodies, 256, duration_s=args.seconds, rate_per_s=rate)
            )
            p99 = result.percentile_ms(99)
            verdict = "met" if p99 <= args.objective_ms else "MISSED"
            print(f"  {share:.0%} of saturation ({rate:.0f} req/s): {result.summary()}  {verdict}")


if __name__ == "__main__":
    main()
