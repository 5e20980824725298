"""The fuzzer's liveness probe (tests/support/liveness.py) against a server in a thread whose
/health/live can be held: a held poll fails the check unless the request it followed was long
enough to excuse it. The hold is sized from the probe's own idle polls, not a fixed time."""

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.liveness import IDLE_POLLS, ContinuousProbe

pytestmark = pytest.mark.unit


class HoldableServer(ThreadingHTTPServer):
    """Answers /health/live 200; `hold()` makes the next poll wait until `release()`."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.holding = threading.Event()
        self.held = threading.Event()
        self.released = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: HoldableServer

    def do_GET(self) -> None:
        if self.server.holding.is_set():
            self.server.holding.clear()
            self.server.held.set()
            self.server.released.wait(30)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[HoldableServer]:
    server = HoldableServer()
    # A short poll interval: shutdown() waits for one.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield server
    server.released.set()  # a poll still held
    server.shutdown()
    server.server_close()


@pytest.fixture
def probe(server) -> Iterator[ContinuousProbe]:
    probe = ContinuousProbe(server.url, interval_s=0.005)
    yield probe
    probe.close()


def test_an_idle_loop_passes(probe):
    assert probe.freeze(0.0, "nothing") is None
    assert probe.polls >= 20 and not probe.failures


@pytest.mark.parametrize(("requests_per_hold", "excused"), [(0.25, False), (10, True)])
def test_a_held_poll_fails_unless_the_request_excuses_it(server, probe, requests_per_hold, excused):
    # Three times the longest wait the idle polls alone allow (interval and answer).
    hold_s = 3 * IDLE_POLLS * (0.005 + probe.baseline_s)
    server.holding.set()
    assert server.held.wait(30)
    time.sleep(hold_s)
    server.released.set()
    probe.settle()  # the held poll is answered, and one after it as fast as when idle
    problem = probe.freeze(hold_s * requests_per_hold, "the request")
    if excused:
        assert problem is None
    else:
        assert problem is not None and "waited" in problem and "around the request" in problem
