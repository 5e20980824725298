"""Ferry's HTTP server against a Rust-backed one, same app, null backend: which stack to keep.

Issue 43 asks whether the HTTP stack itself is the front end's limit. Two servers run Ferry's
whole app (routes, tokenizer, batcher, metrics, JSON) on the null backend (bench/null_backend.py),
one process each:
  ferry (uvicorn)   `ferry serve`: uvicorn's httptools protocol with Ferry's connection limits
                    and one send per connection per loop turn (server/serve.py)
  granian           the same ASGI app under granian (a Rust HTTP server; hyper and tokio), one
                    worker, uvloop, its ASGI interface
Both stay up; each round loads one then the other (the order alternating), short /predict
requests from 64 closed-loop clients, and the ratio of each round is printed, so the noise of a
shared box is in view. The load generator runs on the same cores.

python -m ferry.bench.http_stack [--seconds 6] [--rounds 3] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fastapi import FastAPI

from ferry.bench.inputs import token_sequences
from ferry.bench.interleaved import block_order
from ferry.bench.loadgen import LoadResult, merge, run_load
from ferry.bench.processes import ManagedProcess, free_port, http_ok, running
from ferry.bench.server_process import default_model_config, ferry_server, write_config
from ferry.bench.targets import predict_body

UVICORN, GRANIAN = "ferry (uvicorn)", "granian"


def granian_app() -> FastAPI:
    """Granian's factory: Ferry's app from $FERRY_CONFIG, on the null backend."""
    from ferry.bench.null_backend import install
    from ferry.server.app import create_app
    from ferry.server.logs import configure_logging
    from ferry.server.settings import load_settings

    install()
    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format)
    return create_app(settings)


@contextlib.contextmanager
def granian_server(config: Path, work: Path) -> Iterator[str]:
    port = free_port()
    command = [
        sys.executable, "-m", "granian", "--interface", "asgi", "--factory", "--loop", "uvloop",
        "--workers", "1", "--no-ws", "--log-level", "warning", "--port", str(port),
        "--backlog", "2048", "ferry.bench.http_stack:granian_app",
    ]  # fmt: skip
    env = {**os.environ, "FERRY_CONFIG": str(config)}
    url = f"http://127.0.0.1:{port}"
    ready = http_ok(f"{url}/health/ready")
    process = ManagedProcess("granian", command, work / "granian.log", ready, url, env=env)
    with running(process):
        yield url


def errors(result: LoadResult) -> int:
    return sum(count for status, count in result.statuses.items() if status != 200)


async def measure(url: str, bodies: list[dict], clients: int, seconds: float) -> LoadResult:
    return await run_load(url, bodies, clients, duration_s=seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="each round's load")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args(argv)
    bodies = [predict_body(t) for t in token_sequences(2000, 8, 16, seed=0)]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        model = default_model_config()
        config = write_config(work / "ferry.toml", [model])
        urls = {
            UVICORN: stack.enter_context(
                ferry_server([model], module="ferry.bench.null_backend")
            ).url,
            GRANIAN: stack.enter_context(granian_server(config, work)),
        }
        for url in urls.values():  # warm both: connections, tokenizer caches
            asyncio.run(measure(url, bodies, args.clients, 1.0))
        rounds: dict[str, list[LoadResult]] = {name: [] for name in urls}
        ratios = []
        for index in range(args.rounds):
            rates = {}
            for name in block_order(index, list(urls)):
                result = asyncio.run(measure(urls[name], bodies, args.clients, args.seconds))
                rounds[name].append(result)
                rates[name] = result.throughput
            ratios.append(rates[GRANIAN] / rates[UVICORN])
        totals = {name: merge(results, elapsed=sum) for name, results in rounds.items()}
    print(f"\nFerry's app on the null backend, short text, {args.clients} clients, one process")
    print(f"{'':18} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for name, result in totals.items():
        print(
            f"{name:18} {result.throughput:>8.0f} {result.percentile_ms(50):>8.1f} "
            f"{result.percentile_ms(99):>8.1f} {errors(result):>7}"
        )
    pooled = totals[GRANIAN].throughput / totals[UVICORN].throughput
    each = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"granian / uvicorn: {pooled:.2f}x (rounds: {each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
