"""A true burst against /predict: N long requests sent at once by aiohttp (an httpx client
spreads the same "burst" over seconds of its own CPU), each with a deadline. Prints served /
(saturation x deadline), 429s (all with Retry-After, all answered at once) and 504s, from one
run; the saturation is measured first, on the same server and inputs.

python -m ferry.bench.burst [--requests 1000] [--timeout-ms 5000] [--min-tokens 96]
    [--max-tokens 126]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp

from ferry.bench.inputs import token_sequences
from ferry.bench.loadgen import run_load
from ferry.bench.server_process import default_model_config, ferry_server


async def burst(url: str, bodies: list[dict]) -> list[tuple[int, float, bool]]:
    """(status, seconds to answer, had Retry-After) per request, all sent at once."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = asyncio.Event()

        async def one(body: dict) -> tuple[int, float, bool]:
            await start.wait()
            sent = time.perf_counter()
            async with session.post(f"{url}/predict", json=body) as response:
                await response.read()
                return (
                    response.status,
                    time.perf_counter() - sent,
                    "Retry-After" in response.headers,
                )

        tasks = [asyncio.ensure_future(one(body)) for body in bodies]
        await asyncio.sleep(0.5)  # every task parked at the gate
        start.set()
        return list(await asyncio.gather(*tasks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--timeout-ms", type=int, default=5000)
    parser.add_argument("--min-tokens", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=126)
    args = parser.parse_args(argv)
    inputs = token_sequences(args.requests, args.min_tokens, args.max_tokens, seed=5)
    config = default_model_config(batching={"max_queue_size": 2 * args.requests})
    with ferry_server([config], server={"max_connections": 4 * args.requests}) as server:
        warm = [{"input_ids": ids} for ids in inputs[:200]]
        saturation = asyncio.run(run_load(server.url, warm, 64)).throughput
        bodies = [{"input_ids": ids, "timeout_ms": args.timeout_ms} for ids in inputs]
        answers = asyncio.run(burst(server.url, bodies))
    served = [s for status, s, _ in answers if status == 200]
    refused = [(s, retry) for status, s, retry in answers if status == 429]
    others = sorted({status for status, _, _ in answers} - {200, 429})
    possible = saturation * args.timeout_ms / 1000
    print(f"saturation {saturation:.1f} req/s: {possible:.0f} could meet {args.timeout_ms} ms")
    print(
        f"served {len(served)} ({len(served) / possible:.2f} x possible, target >= 0.85), "
        f"served p99 {sorted(served)[int(0.99 * (len(served) - 1))] if served else 0:.2f} s"
    )
    print(
        f"429 {len(refused)}, without Retry-After {sum(not r for _, r in refused)}, "
        f"slowest refusal {max((s for s, _ in refused), default=0):.2f} s; "
        f"504 {sum(status == 504 for status, _, _ in answers)}, other statuses {others}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
