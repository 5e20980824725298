"""Where a one-row tabular request's time goes in one Ferry process, layer by layer (issue 43).

bench.tabular finds Ferry at about a third of Triton's requests on a one-row gradient-boosting
model, with Ferry's event loop the limit. This sends the same request (KServe v2 JSON, one row
of 30 FP32) at the same load (64 closed-loop clients from wrk) to three servers, each one
process whose event loop is its limit:
  bare protocol    bench/floor_servers.py --kind protocol: the request parsed, its JSON read,
                   a fixed answer written; no framework
  uvicorn + ASGI   bench/floor_servers.py --kind asgi: the same behind uvicorn as Ferry runs it
  ferry            `ferry serve --model gb=...` in one process (replicas = 1), its direct lane
                   off: the gateway's path, which the no-socket line below runs too
  ferry, direct lane  the same with its direct lane (server/direct_lane.py), as it serves
and, in this process, Ferry's app with no socket at all: `clients` tasks calling it as an ASGI
app in a closed loop on uvloop (the gateway, KServe decoding, the batcher, ONNX Runtime, the
answer).

For each: req/s and its event loop's CPU per request. Then Ferry's per request split in two:
its own path (the app with no socket) and the rest (the HTTP server, its connection guards and
the socket around the app), against what uvicorn + ASGI and the bare protocol take in all, and
what Ferry's own path alone would serve with an HTTP layer that cost nothing. All four stay up
and are loaded in alternating rounds (bench/interleaved.py's order), so a drift of the box
falls on each alike; one run.

    python -m ferry.bench.front_end_layers [--seconds 6] [--rounds 3] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import uvloop

from ferry.bench.interleaved import block_order
from ferry.bench.process_cpu import CpuSample
from ferry.bench.processes import ManagedProcess, free_port, http_ok, running
from ferry.bench.tabular import MODEL, bodies, export_model, ferry_process
from ferry.bench.wrk_load import closed_loop
from ferry.server.disconnect import DISCONNECTED

PATH = f"/v2/models/{MODEL}/infer"
BARE, ASGI, FERRY, APP = "bare protocol", "uvicorn + ASGI", "ferry", "ferry, no socket"
LANE = "ferry, direct lane"


@dataclass(frozen=True)
class Layer:
    throughput: float  # req/s
    loop_us: float  # the event loop's CPU per request
    failed: int  # answers other than 200


@dataclass
class Tally:
    """One layer's rounds, summed."""

    requests: int = 0
    seconds: float = 0.0
    loop_s: float = 0.0
    failed: int = 0

    def add(self, done: Round) -> None:
        self.requests += done.requests
        self.seconds += done.seconds
        self.loop_s += done.loop_s
        self.failed += done.failed

    def layer(self) -> Layer:
        requests = max(1, self.requests)
        return Layer(requests / max(self.seconds, 1e-9), self.loop_s / requests * 1e6, self.failed)


class Round(NamedTuple):
    """One round of load on one layer."""

    requests: int
    seconds: float
    loop_s: float  # the event loop's CPU meanwhile
    failed: int  # answers other than 200


def not_200(statuses: Mapping[int, int]) -> int:
    return sum(n for status, n in statuses.items() if status != 200)


def floor_process(kind: str, work: Path) -> ManagedProcess:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "ferry.bench.floor_servers", "--kind", kind]
    command += ["--port", str(port)]
    return ManagedProcess(kind, command, work / f"{kind}.log", http_ok(f"{url}/ready"), url=url)


def server_round(
    server: ManagedProcess, payloads: list[dict], clients: int, seconds: float
) -> Round:
    """One round of load on a server: what it answered and its main thread's CPU meanwhile."""
    before = CpuSample.of(server.pid or 0)
    result = closed_loop(server.url, payloads, clients, PATH, seconds)
    after = CpuSample.of(server.pid or 0)
    loop_s = (after.loop_s or 0.0) - (before.loop_s or 0.0)
    return Round(result.completed, result.elapsed_s, loop_s, not_200(result.statuses))


class AppAlone:
    """Ferry's app in this process with no socket: `clients` tasks each calling it as ASGI,
    one request after another, with what Ferry's HTTP protocol hands every request (its
    disconnect future)."""

    def __init__(self, model: Path, payloads: list[dict], clients: int) -> None:
        from ferry.server.app import create_app
        from ferry.server.settings import load_settings

        settings = load_settings(
            None, environ={}, extra_models=[{"name": MODEL, "path": str(model)}]
        )
        self._app = create_app(settings)
        self._bodies = [orjson.dumps(payload) for payload in payloads]
        self._clients = clients

    @contextlib.asynccontextmanager
    async def started(self) -> AsyncIterator[AppAlone]:
        async with self._app.router.lifespan_context(self._app):
            gc.freeze()  # as a serving process does once its models are up (server/gc_pauses.py)
            yield self

    async def round(self, seconds: float) -> Round:
        statuses: Counter[int] = Counter()
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        began, cpu_began = time.perf_counter(), time.thread_time()
        await asyncio.gather(*(self._client(i, until, statuses) for i in range(self._clients)))
        elapsed, cpu = time.perf_counter() - began, time.thread_time() - cpu_began
        return Round(sum(statuses.values()), elapsed, cpu, not_200(statuses))

    async def _client(self, index: int, until: float, statuses: Counter[int]) -> None:
        loop = asyncio.get_running_loop()
        sent = index
        while loop.time() < until:
            body = self._bodies[sent % len(self._bodies)]
            sent += self._clients
            await one_request(self._app, body, loop.create_future(), statuses)


async def one_request(
    app: Any, body: bytes, gone: asyncio.Future[None], statuses: Counter[int]
) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "headers": headers,
        "extensions": {DISCONNECTED: gone},
    }
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone  # never: the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] += 1

    await app(scope, receive, send)


def report(layers: dict[str, Layer], clients: int) -> str:
    lines = [
        f"one-row tabular request (KServe v2 JSON), {clients} clients, one process each",
        f"{'':18} {'req/s':>8} {'loop us/req':>12} {'not 200':>8}",
    ]
    for name, layer in layers.items():
        lines.append(f"{name:18} {layer.throughput:8.0f} {layer.loop_us:12.1f} {layer.failed:8}")
    ferry, app = layers.get(FERRY), layers.get(APP)
    if ferry is None or app is None:
        return "\n".join(lines)
    rest = ferry.loop_us - app.loop_us
    lines += [
        f"ferry's {ferry.loop_us:.0f} us a request: its own path {app.loop_us:.0f} us "
        f"({app.loop_us / ferry.loop_us:.0%}), the HTTP server and socket around it {rest:.0f} us "
        f"({rest / ferry.loop_us:.0%})",
    ]
    for name in (ASGI, BARE):
        if name in layers:
            floor = layers[name]
            lines.append(
                f"  {name} takes {floor.loop_us:.0f} us a request in all: ferry is "
                f"{ferry.throughput / floor.throughput:.2f}x its req/s"
            )
    lines.append(
        f"with an HTTP layer that cost nothing, ferry's own path would serve "
        f"{1e6 / app.loop_us:.0f} req/s a core ({ferry.loop_us / app.loop_us:.2f}x today's)"
    )
    lane = layers.get(LANE)
    if lane is not None:
        lines.append(
            f"the direct lane: {lane.loop_us:.0f} us a request, "
            f"{lane.throughput / ferry.throughput:.2f}x the gateway's req/s"
        )
    return "\n".join(lines)


async def measure(
    model: Path, payloads: list[dict], work: Path, args: argparse.Namespace
) -> dict[str, Layer]:
    """Every layer, in alternating rounds: the three servers up at once, Ferry's app here."""
    tallies = {name: Tally() for name in (BARE, ASGI, FERRY, LANE, APP)}
    round_s = args.seconds / args.rounds
    with contextlib.ExitStack() as stack:
        servers = {
            BARE: stack.enter_context(running(floor_process("protocol", work))),
            ASGI: stack.enter_context(running(floor_process("asgi", work))),
            FERRY: stack.enter_context(
                running(ferry_process(model, work, replicas=1, direct_lane=False))
            ),
            LANE: stack.enter_context(running(ferry_process(model, work, replicas=1))),
        }
        alone = AppAlone(model, payloads, args.clients)
        async with alone.started():
            for server in servers.values():  # warm up: connections, caches, the cost model
                await asyncio.to_thread(server_round, server, payloads, args.clients, 1.0)
            await alone.round(1.0)
            for index in range(args.rounds):
                for name in block_order(index, list(tallies)):
                    if name == APP:
                        tallies[name].add(await alone.round(round_s))
                        continue
                    load = (servers[name], payloads, args.clients, round_s)
                    tallies[name].add(await asyncio.to_thread(server_round, *load))
    return {name: tally.layer() for name, tally in tallies.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="Each layer's load, in all.")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds.")
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferry-layers-") as tmp:
        work = Path(tmp)
        model, rows = export_model(work / "model")
        # uvloop, as under `ferry serve`: the app's tasks scheduled by the same loop.
        layers = uvloop.run(measure(model, bodies(rows), work, args))
    print(report(layers, args.clients))
    return 0


if __name__ == "__main__":
    sys.exit(main())
