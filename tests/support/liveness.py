"""`/health/live` polled from a thread while a hostile request runs: the slowest answer tells
whether the request froze the server's event loop.

No wall-clock bound: the slowest answer is judged against the same run's own times. A loop
frozen by the request's work waits most of the request's time to answer one poll; a loop that
hands the work off answers a poll within a few of its own idle polls. (Issue 35's 50 ms is a
performance target, for `bench.images`' loop stalls to report, not for a pass/fail test.)"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import httpx

# A poll is slow enough to be a freeze when it waited past half the request's own time and past
# this many idle polls (their interval and the slowest answer before the request went out): a
# request shorter than that cannot hide a freeze longer than the loop's own idle answers.
BASELINE_POLLS, IDLE_POLLS = 20, 4


class LivenessProbe:
    """`with LivenessProbe(url) as probe:` polls until the block ends; then `probe.worst_s` is
    the slowest answer and `probe.failures` the polls not answered 200."""

    def __init__(self, url: str, interval_s: float = 0.01) -> None:
        self._url = f"{url}/health/live"
        self._interval_s = interval_s
        self._done = threading.Event()
        self._polled = threading.Event()  # the baseline polls are done: the request may go out
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.worst_s = 0.0
        self.baseline_s = 0.0  # the slowest answer before the hostile request
        self.polls = 0
        self.failures: list[str] = []
        self.request_s = 0.0  # how long the block (the hostile request) took

    def __enter__(self) -> LivenessProbe:
        self._thread.start()
        self._polled.wait(30)
        self._request_started = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.request_s = time.perf_counter() - self._request_started
        self._done.set()
        self._thread.join()

    def _poll(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._done.is_set():
                started = time.perf_counter()
                try:
                    status = client.get(self._url).status_code
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                else:
                    if status != 200:
                        self.failures.append(f"status {status}")
                took = time.perf_counter() - started
                self.polls += 1
                if self._polled.is_set():
                    self.worst_s = max(self.worst_s, took)
                else:
                    self.baseline_s = max(self.baseline_s, took)
                    if self.polls >= BASELINE_POLLS:
                        self._polled.set()
                self._done.wait(self._interval_s)

    def assert_lively(self) -> None:
        assert self.polls >= BASELINE_POLLS and not self.failures, self.failures
        idle = IDLE_POLLS * (self._interval_s + self.baseline_s)
        bound = max(self.request_s / 2, idle)
        assert self.worst_s <= bound, (
            f"/health/live waited {self.worst_s * 1000:.0f} ms: past half the request's "
            f"{self.request_s * 1000:.0f} ms and {IDLE_POLLS} idle polls "
            f"({idle * 1000:.0f} ms; the slowest idle answer {self.baseline_s * 1000:.0f} ms)"
        )
