"""The gateway in-process, driven as uvicorn drives it: the one dispatcher of hot routes (replies,
streams, errors in the route's dialect, a client that leaves) and the drain deadline."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from ferry.server.dialects import KSERVE, OPENAI
from ferry.server.disconnect import DISCONNECTED
from ferry.server.drain import DrainState
from ferry.server.errors import InvalidInput
from ferry.server.gateway import Gateway
from ferry.server.hot import HotCall, HotRoutes
from ferry.server.kserve.shared_memory import LocalRegions
from ferry.server.metrics import FerryMetrics
from ferry.server.replies import Reply, Stream
from ferry.server.services import build_services
from ferry.server.settings import Settings

pytestmark = pytest.mark.unit


def scope(path: str, method: str = "POST", **extensions: object) -> dict:
    headers = [(b"content-type", b"application/json")]
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers,
        "state": {},
        "extensions": extensions,
    }


class Client:
    """One request's `receive` (the body, then silence) and what was sent back."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self._body_sent = False

    async def receive(self) -> dict:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.Event().wait()  # the client stays
        return {}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


class Handlers:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def hangs(self, call: HotCall) -> Reply:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")

    async def streams(self, call: HotCall) -> Stream:
        async def events():
            yield "data: {}\n\n"
            self.started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            yield "unreachable"

        return Stream(events())

    async def refuses(self, call: HotCall) -> Reply:
        raise InvalidInput("input", "bad")


async def finishes(task: asyncio.Task) -> None:
    """The task ends on its own (wait_for's cancel on a timeout would end it too)."""
    await asyncio.wait({task}, timeout=5)
    assert task.done()
    task.result()


def make(handlers: Handlers) -> tuple[Gateway, DrainState, FerryMetrics]:
    async def framework(scope, receive, send) -> None:
        raise AssertionError("hot routes never reach the framework")

    hot = HotRoutes()
    hot.add("POST", "/predict", handlers.hangs, OPENAI)
    hot.add("POST", "/v1/chat/completions", handlers.streams, OPENAI)
    hot.add("POST", "/v1/embeddings", handlers.refuses, OPENAI)
    hot.add("POST", "/v2/models/{name}/infer", handlers.refuses, KSERVE)
    services = build_services(Settings(), FerryMetrics(), LocalRegions())
    return Gateway(framework, services, hot), services.drain, services.metrics


async def test_an_error_is_answered_in_the_dialect_the_route_was_registered_with():
    gateway, _, _ = make(Handlers())
    for path, expected in [
        (
            "/v1/embeddings",
            (
                400,
                {
                    "error": {
                        "message": "bad",
                        "type": "invalid_request_error",
                        "param": "input",
                        "code": 400,
                    }
                },
            ),
        ),
        ("/v2/models/m/infer", (400, {"error": "input: bad"})),
    ]:
        client = Client()
        await gateway(scope(path), client.receive, client.send)
        assert (client.sent[0]["status"], orjson.loads(client.body())) == expected


async def test_a_stream_goes_out_as_server_sent_events_and_a_leaving_client_aborts_it():
    handlers, client = Handlers(), Client()
    gateway, drain, _ = make(handlers)
    gone = asyncio.get_running_loop().create_future()
    request = scope("/v1/chat/completions", **{DISCONNECTED: gone})
    task = asyncio.create_task(gateway(request, client.receive, client.send))
    await handlers.started.wait()
    start = client.sent[0]
    assert start["status"] == 200
    assert dict(start["headers"])[b"content-type"].startswith(b"text/event-stream")
    assert client.sent[1] == {
        "type": "http.response.body",
        "body": b"data: {}\n\n",
        "more_body": True,
    }
    gone.set_result(None)  # what Ferry's protocol does when the connection is lost
    await finishes(task)  # returns: the cancel was the gateway's own, not a crash
    assert handlers.cancelled.is_set() and drain.in_flight == 0


async def test_a_client_that_leaves_cancels_its_handler_and_is_counted_as_499():
    handlers, client = Handlers(), Client()
    gateway, _, metrics = make(handlers)
    gone = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        gateway(scope("/predict", **{DISCONNECTED: gone}), client.receive, client.send)
    )
    await handlers.started.wait()
    gone.set_result(None)
    await finishes(task)
    assert handlers.cancelled.is_set() and client.sent == []  # nobody to answer
    counted = metrics.requests.labels("", "/predict", "499")._value.get()
    assert counted == 1


async def run_until_expired(gateway: Gateway, drain: DrainState, path: str, started):
    client = Client()
    task = asyncio.create_task(gateway(scope(path), client.receive, client.send))
    await started.wait()
    drain.begin()
    drain.expire()
    await asyncio.wait_for(task, 5)
    return client.sent


async def test_a_request_still_running_at_the_drain_deadline_gets_503_with_retry_after():
    handlers = Handlers()
    gateway, drain, _ = make(handlers)
    messages = await run_until_expired(gateway, drain, "/predict", handlers.started)
    start = messages[0]
    assert start["status"] == 503
    assert (b"retry-after", b"1") in start["headers"]
    assert b"shutting down" in messages[1]["body"]
    assert drain.in_flight == 0


async def test_a_stream_still_running_at_the_drain_deadline_ends_with_an_error_and_done():
    handlers = Handlers()
    gateway, drain, _ = make(handlers)
    messages = await run_until_expired(gateway, drain, "/v1/chat/completions", handlers.started)
    assert messages[0]["status"] == 200
    last = messages[-1]
    assert last["more_body"] is False and last["body"].endswith(b"data: [DONE]\n\n")
    event = orjson.loads(last["body"].split(b"\n\n")[0].removeprefix(b"data: "))
    assert event["error"]["code"] == 503 and "shutting down" in event["error"]["message"]
    assert handlers.cancelled.is_set() and drain.in_flight == 0


async def test_new_inference_requests_while_draining_get_503_before_their_handler():
    handlers, client = Handlers(), Client()
    gateway, drain, _ = make(handlers)
    drain.begin()
    await gateway(scope("/predict"), client.receive, client.send)
    assert client.sent[0]["status"] == 503
    assert not handlers.started.is_set()  # refused before the handler ran
