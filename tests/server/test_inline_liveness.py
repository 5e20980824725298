"""Liveness probes answered as they are parsed (server/inline_liveness.py): within the read that
brought them, before the loop's next turn, never ahead of an earlier request's answer. (The
keep-alive timer such an answer arms: test_connection_limits.py.)"""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
from prometheus_client import CollectorRegistry, generate_latest
from uvicorn.server import ServerState

from ferry.server.connection_limits import ConnectionLimits, protocol_class
from ferry.server.gateway import LIVENESS
from ferry.server.inline_liveness import InlineLiveness
from ferry.server.metrics import FerryMetrics
from tests.support.metrics import metric_value

pytestmark = pytest.mark.unit

LIMITS = ConnectionLimits(
    max_connections=10,
    header_timeout_s=5,
    body_timeout_s=5,
    max_header_bytes=16384,
    max_headers=50,
)
PROBE = b"GET /health/live HTTP/1.1\r\nHost: ferry\r\n\r\n"
OTHER = b"GET /v2/models HTTP/1.1\r\nHost: ferry\r\n\r\n"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.reading = True

    def write(self, data: bytes) -> None:  # type: ignore[override]  # bytes only here
        self.written += data

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name)


async def app(scope, receive, send) -> None:
    headers = [(b"content-length", b"12")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"from the app"})


def connection(registry: CollectorRegistry) -> Transport:
    bodies = {path: reply.body for path, reply in LIVENESS.items()}
    liveness = InlineLiveness(FerryMetrics(registry), bodies)
    config = uvicorn.Config(app, log_config=None)
    protocol = protocol_class(LIMITS, answer_as_parsed=liveness.answer)(config, ServerState(), {})
    transport = Transport()
    protocol.connection_made(transport)
    transport.protocol = protocol  # type: ignore[attr-defined]  # the test's handle on it
    return transport


async def test_a_probe_is_answered_within_the_read_that_brought_it():
    registry = CollectorRegistry()
    transport = connection(registry)
    transport.protocol.data_received(PROBE + PROBE.replace(b"GET", b"HEAD"))  # type: ignore[attr-defined]
    # No turn of the loop yet: both answers are out.
    get, head = transport.written.split(b"HTTP/1.1 200 OK")[1:]
    assert get.endswith(b'\r\n\r\n{"status":"alive"}') and b"x-request-id: " in get
    assert head.endswith(b"\r\n\r\n") and b"content-length: 18" in head
    await asyncio.sleep(0)  # the turn's end: its metric writes made (server/turn_writes.py)
    text = generate_latest(registry).decode()
    assert metric_value(text, "ferry_requests_total", endpoint="/health/live") == 2


async def test_a_probe_behind_an_unanswered_request_is_left_to_the_app_in_its_turn():
    transport = connection(CollectorRegistry())
    transport.protocol.data_received(OTHER + PROBE)  # type: ignore[attr-defined]
    assert transport.written == b""  # not answered ahead of the first request
    for _ in range(10):
        await asyncio.sleep(0)
    assert transport.written.count(b"from the app") == 2  # both, in order, by the app


@pytest.mark.parametrize(
    "request_",
    [
        PROBE.replace(b"/health/live", b"/health/live?verbose=1"),
        PROBE.replace(b"GET", b"POST"),
        OTHER,
        PROBE.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),  # then closed
    ],
    ids=["query", "post", "other-path", "connection-close"],
)
async def test_other_requests_go_to_the_app(request_):
    transport = connection(CollectorRegistry())
    transport.protocol.data_received(request_)  # type: ignore[attr-defined]
    assert transport.written == b""
    for _ in range(10):
        await asyncio.sleep(0)
    assert transport.written.endswith(b"from the app")
