"""Graceful shutdown: SIGTERM with requests in flight; every accepted request is answered."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx

from tests.server_process import default_model_config, ferry_server


async def _fire(url: str, count: int, on_started: asyncio.Event) -> list[int | str]:
    ids = [101, *range(2000, 2250), 102]

    async def one(client: httpx.AsyncClient) -> int | str:
        try:
            response = await client.post("/predict", json={"input_ids": ids})
            return response.status_code
        except httpx.TransportError as exc:
            return type(exc).__name__

    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        tasks = [asyncio.create_task(one(client)) for _ in range(count)]
        await asyncio.sleep(0.3)
        on_started.set()
        return await asyncio.gather(*tasks)


def test_sigterm_drains_in_flight_requests_then_exits_zero():
    config = default_model_config(sessions=1, max_batch_size=4)
    with ferry_server([config], server={"drain_timeout_s": 60}) as server:

        async def scenario() -> tuple[list[int | str], list[int], int]:
            started = asyncio.Event()
            firing = asyncio.create_task(_fire(server.url, 200, started))
            await started.wait()
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            # Draining: readiness and new work answer 503 at once, with Retry-After.
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as probe:
                ready = await probe.get("/health/ready")
                late = await probe.post("/predict", json={"inputs": "late"})
            assert late.headers.get("retry-after")
            return await firing, [ready.status_code, late.status_code], 0

        statuses, during_drain, _ = asyncio.run(scenario())
        assert during_drain == [503, 503]
        assert statuses == [200] * 200, f"lost requests: {set(statuses)}"
        deadline = time.monotonic() + 30
        while server.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.process.returncode == 0
