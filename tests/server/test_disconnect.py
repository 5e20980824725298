"""A client that goes away has its queued work dropped before it reaches the backend."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from ferry.bench.server_process import default_model_config, ferry_server
from ferry.bench.simulated_device import DeviceTimes
from tests.server.conftest import API_SERVERS
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

LONG = [101, *range(2000, 2250), 102]
BUSY = 16
# The busy requests' device time, a batch of one each, is 16 x 0.4 s = 6.4 s on any host: a
# real model's backlog is as short as the host is fast, and a fast host ran it before the
# impatient client gave up (a CI run counted no cancel).
DEVICE = DeviceTimes(launch_ms=0.0, fixed_ms=400.0, per_token_us=0.0, streams=1)
WAIT_S = 60.0


async def _until_predicts_arrived(client: httpx.AsyncClient, count: int) -> None:
    """Until the server has taken `count` /predict requests (in flight or answered): the
    impatient one leaves only once the server has it (a client that left before then gave the
    server nothing to cancel)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        answer = await client.get("/metrics")
        # A scrape that failed is read again: one beside a CPU hog, with two API processes,
        # answered 500 (this test is about the cancel, not /metrics).
        if answer.status_code == 200:
            text = answer.text
            arrived = metric_value(text, "ferry_in_flight_requests", endpoint="/predict")
            arrived += metric_value(text, "ferry_requests_total", endpoint="/predict")
            if arrived >= count:
                return
        assert time.monotonic() < deadline, f"fewer than {count} requests arrived"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("api_servers", API_SERVERS)
def test_disconnected_client_work_is_never_run(api_servers):
    """With API processes, the drop crosses to the engine's queue (wire.Cancel)."""
    config = default_model_config(
        backend={"sessions": 1}, batching={"max_batch_size": 1, "dispatch_when_idle": False}
    )
    with ferry_server(
        [config],
        server={"api_servers": api_servers},
        env=DEVICE.to_env(),
        module="ferry.bench.simulated_device",
    ) as server:

        async def scenario() -> list[int]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                busy = [
                    asyncio.create_task(client.post("/predict", json={"input_ids": LONG}))
                    for _ in range(BUSY)
                ]
                await _until_predicts_arrived(client, BUSY)
                async with httpx.AsyncClient(base_url=server.url, timeout=60) as impatient:
                    gives_up = asyncio.create_task(
                        impatient.post("/predict", json={"input_ids": [101, 7, 102]})
                    )
                    await _until_predicts_arrived(client, BUSY + 1)
                    # Time to read and queue its 40-byte body, far less than the backlog left.
                    await asyncio.sleep(0.5)
                    gives_up.cancel()
                return [r.status_code for r in await asyncio.gather(*busy)]

        assert asyncio.run(scenario()) == [200] * BUSY
        text = server.metrics()
        assert metric_value(text, "ferry_rejections_total", reason="cancelled") == 1
        # Sixteen batches of one ran: the impatient client's never did.
        assert metric_value(text, "ferry_batch_size_requests_count") == BUSY
