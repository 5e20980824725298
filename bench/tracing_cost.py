"""What tracing costs the event loop: CPU per request with tracing off, on at 1 % sampling and on
at 100 %.

One Ferry process on the null backend (bench/null_backend.py: the model costs nothing, so the
figures are the front end's and the batcher's alone), short /predict requests at saturation,
three runs that differ only in tracing. Per completed request, from /proc:
  loop ms     the event-loop thread's CPU: what the request path (spans made, context read)
              takes from the cores the model needs
  process ms  the whole process's, the SDK's export thread (encoding, sending) included
The spans go over OTLP/HTTP to a sink in this process that answers 200 and counts what it got
(the trace server's own cost is not Ferry's). The load sends no `traceparent`, so each request
is a root and the sampler's ratio decides.

python -m ferry.bench.tracing_cost [--duration 10] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ferry.bench.inputs import token_sequences
from ferry.bench.loadgen import run_load
from ferry.bench.process_cpu import process_cpu_s, thread_cpu_s
from ferry.bench.server_process import default_model_config, ferry_server

# (label, the sampler's ratio; None: tracing off)
RUNS: tuple[tuple[str, float | None], ...] = (("off", None), ("1 %", 0.01), ("100 %", 1.0))


class _Sink(BaseHTTPRequestHandler):
    received = 0  # OTLP export requests

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).received += 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@contextmanager
def otlp_sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint that takes every export and keeps nothing."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()


@dataclass(frozen=True)
class Run:
    label: str
    throughput: float
    loop_ms: float
    process_ms: float

    def row(self) -> str:
        return f"{self.label:>8} {self.throughput:9.0f} {self.loop_ms:9.3f} {self.process_ms:11.3f}"


def measure(
    label: str,
    ratio: float | None,
    endpoint: str,
    bodies: list[dict],
    duration_s: float,
    clients: int,
) -> Run:
    model = default_model_config(batching={"max_batch_size": 64, "max_queue_size": 4096})
    server: dict[str, object] = {}
    env: dict[str, str] = {}
    if ratio is not None:
        server["otlp_traces_endpoint"] = endpoint
        env = {
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(ratio),
        }
    with ferry_server([model], server=server, env=env, module="ferry.bench.null_backend") as handle:
        pid = handle.pid
        assert pid is not None
        asyncio.run(run_load(handle.url, bodies, clients, duration_s=min(2.0, duration_s)))
        loop, process = thread_cpu_s(pid), process_cpu_s(pid)
        result = asyncio.run(run_load(handle.url, bodies, clients, duration_s=duration_s))
        loop, process = thread_cpu_s(pid) - loop, process_cpu_s(pid) - process
    n = max(result.statuses.get(200, 0), 1)
    return Run(label, result.throughput, loop * 1000 / n, process * 1000 / n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    bodies = [{"input_ids": ids} for ids in token_sequences(2000, 8, 16, args.seed)]
    print(
        f"/predict of 8-16 tokens on the null backend, {args.concurrency} clients, "
        f"{args.duration:g} s per run; CPU ms per request"
    )
    print(f"{'tracing':>8} {'req/s':>9} {'loop ms':>9} {'process ms':>11}")
    with otlp_sink() as endpoint:
        runs = []
        for label, ratio in RUNS:
            runs.append(measure(label, ratio, endpoint, bodies, args.duration, args.concurrency))
            print(runs[-1].row(), flush=True)
    off = runs[0]
    for run in runs[1:]:
        print(
            f"tracing {run.label}: loop +{run.loop_ms - off.loop_ms:.3f} ms a request "
            f"(x{run.loop_ms / off.loop_ms:.2f}), process +{run.process_ms - off.process_ms:.3f} ms"
        )
    print(f"OTLP exports received: {_Sink.received}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
