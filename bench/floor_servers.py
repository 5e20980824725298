"""Two servers that do what any Python HTTP server must do for a JSON request, and nothing else:
the floors under Ferry's own front end (bench/front_end_layers.py).

  protocol   uvloop and httptools, no framework: the request parsed, its body read as JSON
             (orjson) and a fixed KServe-shaped answer written, one write a request
  asgi       uvicorn as Ferry runs it (httptools, uvloop, no access log) with an ASGI app that
             reads the body, parses it and sends the same answer: the HTTP server's own cost

Both answer any request with 200 and the same body (a GET, which has none, is the readiness
probe); a body that is not JSON gets 400.

    python -m ferry.bench.floor_servers --kind protocol --port 8001
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, cast

import httptools
import orjson
import uvloop

from ferry.bench.bare_http import serve

ANSWER = orjson.dumps(
    {
        "model_name": "floor",
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [1, 2], "data": [0, 1]}],
    }
)
HEAD = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


def answer(body: bytes) -> tuple[int, bytes]:
    """The status and body for a request's body: its JSON read, as every server must."""
    if not body:
        return 200, ANSWER
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return 400, b'{"error": "not JSON"}'
    return 200, ANSWER


class FloorProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time per connection (as wrk sends them)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass
        self._parser = httptools.HttpRequestParser(self)
        self._body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._transport.close()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status, body = answer(b"".join(self._body))
        self._body = []
        reason = b"OK" if status == 200 else b"Bad Request"
        self._transport.write(HEAD % (status, reason, len(body)) + body)


async def floor_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    status, body = answer(b"".join(chunks))
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("protocol", "asgi"), required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.kind == "protocol":
        uvloop.run(serve(args.port, FloorProtocol))
        return 0
    import uvicorn

    uvicorn.run(
        floor_asgi,
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        access_log=False,
        log_level="warning",
        lifespan="off",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
