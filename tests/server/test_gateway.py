"""The gateway in-process, driven as uvicorn drives it: what requests still running get when the
drain deadline passes."""

from __future__ import annotations

import asyncio

from ferry.server.drain import DrainState
from ferry.server.gateway import Gateway
from ferry.server.hot import HotCall, HotRoutes, Reply
from ferry.server.metrics import FerryMetrics
from ferry.server.settings import Settings


def scope(path: str, method: str = "POST") -> dict:
    headers = [(b"content-type", b"application/json")]
    return {"type": "http", "method": method, "path": path, "headers": headers, "state": {}}


async def run_until_expired(gateway: Gateway, drain: DrainState, path: str, started: asyncio.Event):
    messages: list[dict] = []
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.Event().wait()  # the client stays
        return {}

    async def send(message: dict) -> None:
        messages.append(message)

    task = asyncio.create_task(gateway(scope(path), receive, send))
    await started.wait()
    drain.begin()
    drain.expire()
    await asyncio.wait_for(task, 5)
    return messages


def make(started: asyncio.Event) -> tuple[Gateway, DrainState]:
    async def hangs(call: HotCall) -> Reply:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def streams(scope, receive, send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        started.set()
        await asyncio.Event().wait()

    hot = HotRoutes()
    hot.add("POST", "/predict", hangs)
    drain = DrainState()
    gateway = Gateway(
        streams, settings=Settings(), metrics=FerryMetrics(), drain=drain, hot=hot, state=None
    )
    return gateway, drain


async def test_a_request_still_running_at_the_drain_deadline_gets_503_with_retry_after():
    started = asyncio.Event()
    gateway, drain = make(started)
    messages = await run_until_expired(gateway, drain, "/predict", started)
    start = messages[0]
    assert start["status"] == 503
    assert (b"retry-after", b"1") in start["headers"]
    assert b"shutting down" in messages[1]["body"]
    assert drain.in_flight == 0


async def test_a_stream_still_running_at_the_drain_deadline_ends_with_an_error_and_done():
    started = asyncio.Event()
    gateway, drain = make(started)
    messages = await run_until_expired(gateway, drain, "/v1/chat/completions", started)
    assert messages[0]["status"] == 200
    last = messages[-1]
    assert last["more_body"] is False
    assert b'"code": 503' in last["body"] and last["body"].endswith(b"data: [DONE]\n\n")
    assert drain.in_flight == 0


async def test_new_inference_requests_while_draining_get_503_before_their_handler():
    started = asyncio.Event()
    gateway, drain = make(started)
    drain.begin()
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    await gateway(scope("/predict"), receive, send)
    assert sent[0]["status"] == 503
    assert not started.is_set()  # refused before the handler ran
