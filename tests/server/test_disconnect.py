"""A client that goes away has its queued work dropped before it reaches the backend."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from ferry.bench.server_process import default_model_config, ferry_server
from tests.server.conftest import API_SERVERS
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

LONG = [101, *range(2000, 2250), 102]


@pytest.mark.parametrize("api_servers", API_SERVERS)
def test_disconnected_client_work_is_never_run(api_servers):
    """With API processes, the drop crosses to the engine's queue (wire.Cancel)."""
    config = default_model_config(
        backend={"sessions": 1}, batching={"max_batch_size": 1, "dispatch_when_idle": False}
    )
    with ferry_server([config], server={"api_servers": api_servers}) as server:

        async def scenario() -> list[int]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                busy = [
                    asyncio.create_task(client.post("/predict", json={"input_ids": LONG}))
                    for _ in range(16)
                ]
                await asyncio.sleep(0.05)
                # This one queues behind the 16 (252 tokens each, one at a time) and gives up long
                # before its turn; after 150 ms, not 50: on a loaded host it could give up before
                # the server had read it (a fresh run counted no cancel with api_servers = 2).
                async with httpx.AsyncClient(base_url=server.url, timeout=0.15) as impatient:
                    with contextlib.suppress(httpx.TimeoutException):
                        await impatient.post("/predict", json={"input_ids": [101, 7, 102]})
                return [r.status_code for r in await asyncio.gather(*busy)]

        assert asyncio.run(scenario()) == [200] * 16
        text = server.metrics()
        assert metric_value(text, "ferry_rejections_total", reason="cancelled") == 1
        # Sixteen batches of one ran: the impatient client's never did.
        assert metric_value(text, "ferry_batch_size_requests_count") == 16
