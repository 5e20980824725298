"""A light closed-loop HTTP/1.1 load generator on raw asyncio streams.

Each client keeps one keep-alive connection and sends its next request when the last answer
arrives. Bodies are pre-encoded, so the generator costs the 2-core machine as little CPU as
possible and the server gets the rest. In open loop (`rate_per_s`) a request's latency counts
from its scheduled arrival, so time spent waiting for a free client is not hidden (coordinated
omission). A connection the server drops mid-request is counted in `reconnects` before the
request is sent again: a soak asserts there were none.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    # Refusals (429/503) that came without a Retry-After header: should stay 0.
    refusals_without_retry_after: int = 0
    # Requests sent again because the server reset or closed the connection under them.
    reconnects: int = 0
    # Idle keep-alive connections the server closed between requests (not a failure).
    idle_closes: int = 0

    @property
    def completed(self) -> int:
        return len(self.latencies_s)

    @property
    def throughput(self) -> float:
        return self.statuses.get(200, 0) / self.elapsed_s if self.elapsed_s else 0.0

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000) if self.latencies_s else 0.0

    def summary(self) -> str:
        return (
            f"{self.throughput:8.1f} req/s  p50 {self.percentile_ms(50):7.1f} ms  "
            f"p99 {self.percentile_ms(99):7.1f} ms  statuses {dict(sorted(self.statuses.items()))}"
            + (f"  reconnects {self.reconnects}" if self.reconnects else "")
        )


def merge(
    results: Iterable[LoadResult], elapsed: Callable[[list[float]], float] = max
) -> LoadResult:
    """One result: all latencies and statuses; its time the longest of theirs (loads that ran
    side by side) or, with `elapsed=sum`, all of it (loads that ran one after another)."""
    merged = LoadResult()
    times = []
    for result in results:
        merged.latencies_s += result.latencies_s
        for status, count in result.statuses.items():
            merged.statuses[status] = merged.statuses.get(status, 0) + count
        merged.refusals_without_retry_after += result.refusals_without_retry_after
        times.append(result.elapsed_s)
    merged.elapsed_s = elapsed(times) if times else 0.0
    return merged


def encode_request(host: str, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    await reader.readexactly(int(headers.get("content-length", 0)))
    return status, headers


async def run_load(
    url: str,
    bodies: list[dict],
    concurrency: int,
    path: str = "/predict",
    duration_s: float | None = None,
    rate_per_s: float | None = None,
) -> LoadResult:
    """Send the bodies `concurrency` at a time: each once, or round and round for `duration_s`.

    With `rate_per_s`, requests start on a fixed schedule (open loop, as independent users
    arrive) as long as a client is free to send them.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = [encode_request(f"{host}:{port}", path, b) for b in bodies]
    result = LoadResult()
    sent = 0
    started = time.perf_counter()

    def next_request() -> tuple[bytes, float] | None:
        """The next payload and when it is due."""
        nonlocal sent
        due = started if rate_per_s is None else started + sent / rate_per_s
        if duration_s is None and sent >= len(requests):
            return None
        # Open loop: the schedule decides (every user due within the duration arrives, however
        # late a client is free to send). Closed loop: `due` is always `started`, so the clock.
        now = due if rate_per_s is not None else time.perf_counter()
        if duration_s is not None and now - started >= duration_s:
            return None
        sent += 1
        return requests[(sent - 1) % len(requests)], due

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while (item := next_request()) is not None:
                payload, due = item
                if (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
                # Open loop: the user arrived at `due`, whether or not a client was free then.
                began = due if rate_per_s is not None else time.perf_counter()
                if reader.at_eof():
                    # The server closed this connection while it sat idle (keep-alive expiry):
                    # normal, and not a dropped request. Open a new one before sending.
                    result.idle_closes += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                try:
                    writer.write(payload)
                    status, headers = await _read_response(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    # The connection went away under the request: counted, then sent again.
                    result.reconnects += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    writer.write(payload)
                    status, headers = await _read_response(reader)
                result.latencies_s.append(time.perf_counter() - began)
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status in (429, 503) and "retry-after" not in headers:
                    result.refusals_without_retry_after += 1
                if headers.get("connection") == "close":
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
        finally:
            writer.close()

    clients = concurrency if duration_s is not None else min(concurrency, len(requests))
    await asyncio.gather(*(client() for _ in range(clients)))
    result.elapsed_s = time.perf_counter() - started
    return result
