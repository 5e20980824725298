"""Liveness probes answered while their request is parsed, on the event loop's I/O turn.

Through the ASGI path a probe waits for two more turns of the loop: one that runs its task (with
every other task ready then: a batch's answers, the next requests' parsing) and one that sends
what it wrote (server/coalesced_writes.py). Under 64 clients of JPEGs on 2 cores that put the
probe's p50 at 0.65 ms and its p99 at 8.6-17 ms; answered here (and batches stacked off the
loop, batcher/packing.py), 0.3 ms and 6.8-7.2 ms, beside 3-5 ms for a bare uvloop server on the
same box under the same load (`bench.images`, docs/benchmarks.md).

Only a probe the gateway would answer the same way is answered here: GET or HEAD of exactly
/health/live or /v2/health/live, HTTP/1.1 keep-alive, with no earlier request of its connection
still unanswered (answers keep their order), with tracing off (the gateway gives every traced
request its span) and health not behind the API key. It is counted in ferry_requests_total as
the gateway counts it, and says its request id.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ferry.server import request_ids
from ferry.server.connection_limits import Headers
from ferry.server.metrics import FerryMetrics
from ferry.server.route_policy import record_request


class InlineLiveness:
    def __init__(self, metrics: FerryMetrics, bodies: Mapping[str, bytes]) -> None:
        """`bodies`: each probe path's JSON body, as the gateway answers it (its LIVENESS)."""
        self._metrics = metrics
        self._by_url = {path.encode(): (path, body) for path, body in bodies.items()}

    def answer(
        self,
        method: bytes,
        url: bytes,
        headers: Headers,
        default_headers: Headers,
    ) -> bytes | None:
        """The whole HTTP answer to this probe; None for any other request."""
        found = self._by_url.get(url)
        if found is None or method not in (b"GET", b"HEAD"):
            return None
        started = time.perf_counter()
        path, body = found
        head = [
            b"HTTP/1.1 200 OK",
            *(name + b": " + value for name, value in default_headers),  # date, server
            b"content-type: application/json",
            b"content-length: %d" % len(body),
            request_ids.HEADER + b": " + request_ids.of_headers(headers),
        ]
        record_request(self._metrics, "", path, 200, started)
        return b"\r\n".join(head) + b"\r\n\r\n" + (body if method == b"GET" else b"")
