"""Graceful shutdown: SIGTERM with requests in flight; every accepted request is answered."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from ferry.bench.server_process import default_model_config, ferry_server
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

# Every layout drains alike: one process, API processes in front of an engine, replicas.
LAYOUTS = [
    pytest.param({"api_servers": 1}, id="api1"),
    pytest.param({"api_servers": 2}, id="api2"),
    pytest.param({"replicas": 2}, id="replicas2"),
]


async def _fire(url: str, count: int) -> list[int | str]:
    ids = [101, *range(2000, 2250), 102]

    async def one(client: httpx.AsyncClient) -> int | str:
        try:
            response = await client.post("/predict", json={"input_ids": ids})
            return response.status_code
        except httpx.TransportError as exc:
            return type(exc).__name__

    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        return await asyncio.gather(*(one(client) for _ in range(count)))


async def _in_flight(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return metric_value(text, "ferry_in_flight_requests", endpoint="/predict")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sigterm_drains_in_flight_requests_then_exits_zero(layout):
    """With API processes: each drains, then the engine stops, and the server exits 0; with
    replicas, each drains."""
    # A deadline far off: admission must not refuse (429) what a slow, busy host would finish.
    config = default_model_config(
        backend={"sessions": 1}, batching={"max_batch_size": 4}, timeout_s=600
    )
    settings = {"drain_timeout_s": 60, **layout}
    with ferry_server([config], server=settings) as server:

        async def scenario() -> tuple[list[int | str], float, list[int], str | None]:
            firing = asyncio.create_task(_fire(server.url, 120))
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as probe:
                # Signal only once the server really holds a crowd of accepted requests.
                deadline = time.monotonic() + 30
                while (accepted := await _in_flight(probe)) < 60:
                    assert time.monotonic() < deadline, "requests never arrived"
                    await asyncio.sleep(0.02)
                server.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.2)
                # Draining: readiness and new work answer 503 at once, with Retry-After.
                ready = await probe.get("/health/ready")
                late = await probe.post("/predict", json={"inputs": "late"})
            return (
                await firing,
                accepted,
                [ready.status_code, late.status_code],
                (late.headers.get("retry-after")),
            )

        statuses, accepted, during_drain, retry_after = asyncio.run(scenario())
        assert during_drain == [503, 503] and retry_after
        # Every request the server had accepted is answered; none is lost to a dropped socket.
        assert set(statuses) <= {200, 503}, f"lost requests: {set(statuses)}"
        assert statuses.count(200) >= accepted
        deadline = time.monotonic() + 30
        while server.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.process.returncode == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stop_leaves_no_traceback_in_the_log(layout):
    """The collection at interpreter exit ran the GC pause callback on the closed event loop:
    `RuntimeError: Event loop is closed` at every stop (in each API and engine process)."""
    with ferry_server([default_model_config()], server=layout) as server:
        reply = httpx.post(f"{server.url}/predict", json={"inputs": "hello"}, timeout=30)
        assert reply.status_code == 200
        assert server.stop() == 0
        log = server.log()
    assert "Event loop is closed" not in log and "Traceback" not in log, log[-4000:]
