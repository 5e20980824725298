"""The machine's floor for a liveness probe: a bare uvloop server in a process of its own that
answers every request it reads with a fixed 200, no parsing, no framework. Polled beside Ferry
while Ferry serves a load (bench.images), its latencies are what the box's scheduler alone adds
under that load; Ferry's own cannot be below them.

    python -m ferry.bench.bare_http --port 8001
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import cast

import uvloop

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class BareHttp(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def data_received(self, data: bytes) -> None:
        # One answer a read: a probe's request is one small write, read whole.
        self._transport.write(ANSWER)


async def serve(port: int, protocol: Callable[[], asyncio.Protocol] = BareHttp) -> None:
    """`protocol`'s connections on the loopback `port`, until cancelled."""
    server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    uvloop.run(serve(parser.parse_args(argv).port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
