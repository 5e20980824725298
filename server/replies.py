"""A reply as bytes, and the one JSON encoder every answer and error body goes through."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Message

JSON = b"application/json"
SSE_HEADERS = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: bytes = JSON
    headers: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(frozen=True)
class Stream:
    """A 200 whose body is server-sent events, written as they come. Errors before the first
    event are raised before this exists (and get a status); later ones are events of their own."""

    events: AsyncIterator[str]


def dumps(value: Any) -> bytes:
    """JSON bytes (orjson): numpy arrays written directly, float32 in its shortest form."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=_fallback)


def _fallback(value: Any) -> Any:
    if hasattr(value, "tolist"):  # non-contiguous arrays and numpy scalars
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__}")


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, dumps(value))


def reply_headers(reply: Reply) -> list[tuple[bytes, bytes]]:
    """The headers a reply is sent with, in order (server/direct_lane.py writes the same)."""
    return [
        (b"content-type", reply.content_type),
        (b"content-length", str(len(reply.body)).encode()),
        *reply.headers,
    ]


def header_lines(reply: Reply) -> bytes:
    """reply_headers(reply) as the lines of an HTTP head, as uvicorn writes them (for
    server/direct_lane.py, which writes its own heads)."""
    lines = b"content-type: %s\r\ncontent-length: %d\r\n" % (reply.content_type, len(reply.body))
    if reply.headers:
        lines += b"".join(b"%s: %s\r\n" % (name.lower(), value) for name, value in reply.headers)
    return lines


async def send_reply(send: Callable[[Message], Awaitable[None]], reply: Reply) -> None:
    headers = reply_headers(reply)
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


async def send_stream(send: Callable[[Message], Awaitable[None]], stream: Stream) -> None:
    """The events as one chunked 200; closing the iterator (a cancel too) aborts its work."""
    await send({"type": "http.response.start", "status": 200, "headers": list(SSE_HEADERS)})
    events = stream.events
    try:
        async for event in events:
            await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
    finally:
        await events.aclose()  # type: ignore[attr-defined]  # routes hand it an async generator
    await send({"type": "http.response.body", "body": b"", "more_body": False})
