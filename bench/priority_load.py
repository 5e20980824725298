"""Priorities on a real server: urgent /predict requests under a closed-loop mixed load.

Ferry (`ferry serve`, the default MiniLM model on two sessions) takes 63 closed-loop clients of
mixed 8-128-token requests at priority 0, and beside them an open-loop stream of the same inputs
at priority -10 (`--urgent-rate` a second, sent on schedule by up to 8 clients so none waits
for another; well under one batch slot: strict priorities let urgent work that fills every
slot starve the rest). Prints both medians and their
ratio from the one run (target <= 0.5). `python -m ferry.bench.replay --urgent-every 20` gives
the same verdict deterministically.

python -m ferry.bench.priority_load [--duration-s 30] [--urgent-rate 4]
"""

from __future__ import annotations

import argparse
import asyncio

from ferry.bench.inputs import token_sequences
from ferry.bench.loadgen import LoadResult, run_load
from ferry.bench.server_process import ferry_server

URGENT = -10
BACKGROUND_CLIENTS = 63
URGENT_CLIENTS = 8


async def mixed_load(
    url: str, duration_s: float, urgent_rate: float
) -> tuple[LoadResult, LoadResult]:
    inputs = token_sequences(2000, 8, 128, seed=7)
    background = [{"input_ids": ids} for ids in inputs]
    urgent = [{"input_ids": ids, "priority": URGENT} for ids in reversed(inputs)]
    await run_load(url, background[:200], BACKGROUND_CLIENTS)  # warm up the cost model
    return await asyncio.gather(
        run_load(url, background, BACKGROUND_CLIENTS, duration_s=duration_s),
        run_load(url, urgent, URGENT_CLIENTS, duration_s=duration_s, rate_per_s=urgent_rate),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--urgent-rate", type=float, default=4.0)
    args = parser.parse_args(argv)
    # Keyless clients may not go below priority 0 unless the server lets everyone (tenancy.py).
    with ferry_server(server={"priority_keys": ["*"]}) as server:
        background, urgent = asyncio.run(mixed_load(server.url, args.duration_s, args.urgent_rate))
    print(f"background (priority 0, {BACKGROUND_CLIENTS} clients): {background.summary()}")
    print(f"urgent (priority {URGENT}, {args.urgent_rate:g}/s):      {urgent.summary()}")
    ratio = urgent.percentile_ms(50) / max(background.percentile_ms(50), 1e-9)
    print(f"urgent median / background median: {ratio:.2f} (target <= 0.5)")
    failed = {s for r in (background, urgent) for s in r.statuses if s != 200}
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
