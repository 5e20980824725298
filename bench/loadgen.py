"""A light closed-loop HTTP/1.1 load generator on raw asyncio streams.

Each client keeps one keep-alive connection and sends its next request when the last answer
arrives. Bodies are pre-encoded, so the generator costs the 2-core machine as little CPU as
possible and the server gets the rest.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

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
        )


def encode_request(host: str, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


async def run_load(
    url: str, bodies: list[dict], concurrency: int, path: str = "/predict"
) -> LoadResult:
    """Send every body once, `concurrency` at a time; returns latencies and status counts."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = [encode_request(f"{host}:{port}", path, b) for b in bodies]
    result = LoadResult()
    next_index = 0

    async def client() -> None:
        nonlocal next_index
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while next_index < len(requests):
                payload = requests[next_index]
                next_index += 1
                started = time.perf_counter()
                writer.write(payload)
                status = await _read_response(reader)
                result.latencies_s.append(time.perf_counter() - started)
                result.statuses[status] = result.statuses.get(status, 0) + 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(min(concurrency, len(requests)))))
    result.elapsed_s = time.perf_counter() - started
    return result
