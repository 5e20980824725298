"""bench.front_end_layers' parts: the floor servers read a request's JSON and answer over a real
socket, Ferry's app answers in process with no socket, and the report splits Ferry's time."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from ferry.bench.floor_servers import ANSWER
from ferry.bench.front_end_layers import (
    APP,
    ASGI,
    BARE,
    FERRY,
    LANE,
    PATH,
    AppAlone,
    Layer,
    floor_process,
    one_request,
    report,
)
from ferry.bench.processes import running
from ferry.bench.tabular import bodies, export_model
from ferry.server.disconnect import DISCONNECTED

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    model, rows = export_model(tmp_path_factory.mktemp("tabular"))
    return model, bodies(rows[:8])


@pytest.mark.parametrize("kind", ["protocol", "asgi"])
def test_a_floor_server_reads_the_json_and_answers(tmp_path, tabular, kind):
    _, payloads = tabular
    with running(floor_process(kind, tmp_path)) as server, httpx.Client() as client:
        good = [client.post(f"{server.url}{PATH}", json=payload) for payload in payloads[:3]]
        bad = client.post(f"{server.url}{PATH}", content=b"{not json")
    assert [(r.status_code, r.content) for r in good] == [(200, ANSWER)] * 3
    assert bad.status_code == 400


def test_ferrys_app_answers_with_no_socket(tabular):
    model, payloads = tabular
    alone = AppAlone(model, payloads, clients=4)

    async def one_round():
        async with alone.started():
            return await alone.round(0.3)

    requests, seconds, loop_s, failed = asyncio.run(one_round())
    assert requests > 0 and failed == 0
    assert seconds > 0 and loop_s > 0


def test_each_request_carries_the_disconnect_future_ferrys_protocol_hands_over():
    """Without it the gateway starts a task per request to watch `receive`, which a served
    request never pays: the no-socket figure would not be the served path's."""
    seen = []

    async def app(scope, receive, send):
        seen.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def call():
        gone = asyncio.get_running_loop().create_future()
        statuses = Counter()
        await one_request(app, b"{}", gone, statuses)
        return gone, statuses

    gone, statuses = asyncio.run(call())
    assert seen[0]["extensions"][DISCONNECTED] is gone
    assert seen[0]["path"] == PATH and statuses == {200: 1}


def test_the_report_splits_ferrys_time_between_its_own_path_and_the_http_around_it():
    layers = {
        BARE: Layer(40_000, 25.0, 0),
        ASGI: Layer(10_000, 100.0, 0),
        FERRY: Layer(2_000, 500.0, 0),
        APP: Layer(3_000, 300.0, 0),
        LANE: Layer(3_000, 320.0, 0),
    }
    text = report(layers, 64)
    assert "its own path 300 us (60%), the HTTP server and socket around it 200 us (40%)" in text
    assert "uvicorn + ASGI takes 100 us a request in all: ferry is 0.20x its req/s" in text
    assert "would serve 3333 req/s a core (1.67x today's)" in text
    assert "the direct lane: 320 us a request, 1.50x the gateway's req/s" in text
