"""`engine_window_bytes`: an API process's requests to a stuck engine are bounded in bytes.

What an API process hands to ZMQ stays in its memory until the engine reads it, past the
request's 504; once a window of such bytes is unanswered, new requests get a 429 at once.
"""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from ferry.bench.server_process import ferry_server
from tests.support import plain_graphs
from tests.support.metrics import metric_value
from tests.support.server_processes import pids, wait_until

pytestmark = pytest.mark.integration

LENGTH = 8192
# What one request sends: its FP32 data and INT64 mask, one row of LENGTH each.
REQUEST_BYTES = LENGTH * (4 + 8)
WINDOW_BYTES = 2 * REQUEST_BYTES + REQUEST_BYTES // 2
API_SERVERS = 2
# Each API process sends requests while they fit in its window (at least one).
MOST_SENT = API_SERVERS * max(1, WINDOW_BYTES // REQUEST_BYTES)
UNANSWERED = "ferry_engine_unanswered_bytes"


def body(timeout_ms: int) -> dict[str, object]:
    return {
        "model": "masked",
        "inputs": {"data": [[1.0] * LENGTH], "mask": [[1] * LENGTH]},
        "timeout_ms": timeout_ms,
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    graph = plain_graphs.masked_mean(tmp_path_factory.mktemp("graph") / "masked_mean.onnx")
    with ferry_server(
        [],
        server={"api_servers": API_SERVERS, "engine_window_bytes": WINDOW_BYTES},
        args=["--model", f"masked={graph}"],
    ) as handle:
        wait_until(lambda: len(pids(handle, "api")) == API_SERVERS, what="the API processes")
        yield handle


def post(server, timeout_ms: int) -> httpx.Response:
    # A new connection each time: either API process may take it. (The client's timeout only
    # turns a regression into a failure instead of a hang.)
    return httpx.post(f"{server.url}/predict", json=body(timeout_ms), timeout=60)


def test_a_stopped_engine_gets_429s_past_the_window_not_504s_without_end(server):
    assert post(server, 10_000).status_code == 200
    # (the gauge is written every 0.25 s: waited for, here and below)
    wait_until(lambda: metric_value(server.metrics(), UNANSWERED) == 0, what="no bytes")
    (engine,) = pids(server, "engine")
    os.kill(engine, signal.SIGSTOP)
    try:
        responses = [post(server, 200) for _ in range(4 * MOST_SENT)]
        statuses = [r.status_code for r in responses]
        timed_out = statuses.count(504)
        # Sent (and timed out here) only while they fit; every other one refused at once.
        assert 1 <= timed_out <= MOST_SENT, statuses
        assert statuses.count(429) == len(statuses) - timed_out, statuses
        for response in responses:
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                assert "engine_window_bytes" in response.json()["error"]["message"]
        # The bytes the 504s left behind, no more: reported by the API processes.
        wait_until(
            lambda: metric_value(server.metrics(), UNANSWERED) == timed_out * REQUEST_BYTES,
            what="the unanswered bytes reported",
        )
        metrics = server.metrics()
        refused = metric_value(metrics, "ferry_rejections_total", reason="queue_full")
        assert refused == statuses.count(429)
    finally:
        os.kill(engine, signal.SIGCONT)
    # The engine reads and answers what waited: the window empties, requests are served.
    wait_until(lambda: metric_value(server.metrics(), UNANSWERED) == 0, what="the answers")
    assert [post(server, 10_000).status_code for _ in range(2 * MOST_SENT)] == [200] * (
        2 * MOST_SENT
    )


def test_a_cancelled_request_is_answered_and_its_bytes_freed(server):
    """A client that leaves: the API process cancels its request in the engine, whose Reply
    frees the request's bytes (a stopped engine answers once it resumes)."""
    (engine,) = pids(server, "engine")
    os.kill(engine, signal.SIGSTOP)
    try:
        with pytest.raises(httpx.ReadTimeout):  # the client leaves before the deadline
            httpx.post(f"{server.url}/predict", json=body(60_000), timeout=0.5)
        wait_until(
            lambda: metric_value(server.metrics(), UNANSWERED) == REQUEST_BYTES,
            what="the request's bytes reported",
        )
    finally:
        os.kill(engine, signal.SIGCONT)
    wait_until(lambda: metric_value(server.metrics(), UNANSWERED) == 0, what="the Reply")


def test_a_dead_engine_takes_its_unanswered_bytes_with_it(server):
    """Killed while stopped: nothing it was sent will be answered; its successor starts with
    an empty window (else every request would be refused until a restart of the server)."""
    (engine,) = pids(server, "engine")
    os.kill(engine, signal.SIGSTOP)
    try:
        statuses = [post(server, 200).status_code for _ in range(4 * MOST_SENT)]
        assert 429 in statuses, statuses
    finally:
        os.kill(engine, signal.SIGKILL)
        os.kill(engine, signal.SIGCONT)
    wait_until(lambda: pids(server, "engine") not in ([], [engine]), what="a new engine")
    wait_until(lambda: post(server, 10_000).status_code == 200, what="a request served")
    wait_until(lambda: metric_value(server.metrics(), UNANSWERED) == 0, what="no bytes")
    assert [post(server, 10_000).status_code for _ in range(2 * MOST_SENT)] == [200] * (
        2 * MOST_SENT
    )
