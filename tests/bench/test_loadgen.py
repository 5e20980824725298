"""The load generator against a tiny real HTTP server on loopback: open-loop latency counts from
the scheduled arrival, and a dropped connection is counted, not hidden."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from ferry.bench.loadgen import run_load

pytestmark = pytest.mark.unit

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return True


@asynccontextmanager
async def http_server(
    delay_s: float = 0.0, drop_first_connection: bool = False, close_after_each: bool = False
) -> AsyncIterator[str]:
    """Answers every request with 200 after `delay_s`; may drop its first connection unanswered,
    or close each connection after its answer."""
    connections = itertools.count()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = next(connections)
        try:
            while await read_request(reader):
                if drop_first_connection and number == 0:
                    return  # closes without an answer, as a crashing server would
                await asyncio.sleep(delay_s)
                writer.write(OK)
                await writer.drain()
                if close_after_each:
                    return  # as a keep-alive timeout would, between requests
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


async def test_open_loop_latency_counts_from_the_scheduled_arrival():
    async with http_server(delay_s=0.1) as url:
        # One client, arrivals every 10 ms, 100 ms per answer: the fifth user arrives at 40 ms
        # and is answered after ~500 ms, so it waited at least ~460 ms.
        result = await run_load(url, [{}], 1, duration_s=0.045, rate_per_s=100)
    assert result.statuses == {200: 5}
    assert max(result.latencies_s) >= 0.4, result.latencies_s
    assert result.reconnects == 0


async def test_closed_loop_latency_counts_from_the_send():
    async with http_server(delay_s=0.05) as url:
        result = await run_load(url, [{}] * 4, 1)
    assert result.statuses == {200: 4}
    # Each request waits only for its own answer, not for the ones before it.
    assert max(result.latencies_s) < 0.05 * 4


async def test_a_dropped_connection_is_counted_and_the_request_sent_again():
    async with http_server(drop_first_connection=True) as url:
        result = await run_load(url, [{}] * 3, 1)
    assert result.reconnects == 1
    assert result.statuses == {200: 3}
    assert "reconnects 1" in result.summary()


async def test_an_idle_connection_closed_by_the_server_is_not_a_dropped_request():
    async with http_server(close_after_each=True) as url:
        result = await run_load(url, [{}], 1, duration_s=0.25, rate_per_s=10)
    assert result.statuses == {200: 3}
    assert result.reconnects == 0 and result.idle_closes == 2
