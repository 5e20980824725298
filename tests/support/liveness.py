"""`/health/live` polled from a thread while a hostile request runs (`LivenessProbe`), or all
along a run of them (`ContinuousProbe`, the OpenAPI fuzzer's): the slowest answer tells whether a
request froze the server's event loop.

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
# request shorter than that cannot hide a freeze longer than the loop's own idle answers. Ten,
# not four: a 2-core machine running the suite on two workers held one poll 68 ms around a
# 112 ms request whose idle polls took 7 ms (the freezes these tests guard against: seconds).
BASELINE_POLLS, IDLE_POLLS = 20, 10


def freeze_bound(request_s: float, interval_s: float, baseline_s: float) -> float:
    """The longest a poll may wait while a request of `request_s` runs: half the request's own
    time, or IDLE_POLLS idle polls (`interval_s` apart, answered within `baseline_s`) if longer."""
    return max(request_s / 2, IDLE_POLLS * (interval_s + baseline_s))


class LivenessProbe:
    """`with LivenessProbe(url) as probe:` polls from before the block (its idle baseline) until
    the block, the hostile request, ends; then `probe.assert_lively()` judges the polls."""

    def __init__(self, url: str, interval_s: float = 0.01) -> None:
        self._url = url
        self._interval_s = interval_s
        self.request_s = 0.0  # how long the block (the hostile request) took
        self._problem: str | None = None

    def __enter__(self) -> LivenessProbe:
        self._probe = ContinuousProbe(self._url, self._interval_s)
        self._request_started = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.request_s = time.perf_counter() - self._request_started
        self._probe.close()
        self._problem = self._probe.freeze(self.request_s, "the request")

    def assert_lively(self) -> None:
        assert self._probe.polls >= BASELINE_POLLS, self._probe.failures
        assert self._problem is None, self._problem


class ContinuousProbe:
    """Polls /health/live from a thread for a whole run of requests (the OpenAPI fuzzer's), each
    judged after it by `freeze`. The first BASELINE_POLLS, made before the first request, are the
    idle baseline."""

    def __init__(self, base_url: str, interval_s: float = 0.02) -> None:
        self._client = httpx.Client(base_url=base_url, timeout=60)
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._slowest = 0.0
        self._sent_at: float | None = None
        self._idle = threading.Event()
        self._closed = threading.Event()
        self.baseline_s = 0.0  # the slowest idle answer
        self._last_s = 0.0
        self.polls = 0
        self.failures: list[str] = []
        threading.Thread(target=self._run, daemon=True, name="liveness-probe").start()
        assert self._idle.wait(60), f"{BASELINE_POLLS} idle polls took over 60 s: {self.failures}"

    def close(self) -> None:
        """Stops polling (the fuzzer's probe polls until its process ends)."""
        self._closed.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            started = time.perf_counter()
            with self._lock:
                self._sent_at = started
            try:
                status = self._client.get("/health/live").status_code
            except httpx.HTTPError as exc:
                failure: str | None = repr(exc)
            else:
                failure = None if status == 200 else f"status {status}"
            took = time.perf_counter() - started
            with self._lock:
                self._sent_at = None
                self._last_s = took
                self.polls += 1
                if failure:
                    self.failures.append(failure)
                if self._idle.is_set():
                    self._slowest = max(self._slowest, took)
                else:
                    self.baseline_s = max(self.baseline_s, took)
                    if self.polls >= BASELINE_POLLS:
                        self._idle.set()
            self._closed.wait(self._interval_s)

    def slowest(self) -> float:
        """The longest answer since the last call (or the current poll's wait, if longer)."""
        with self._lock:
            waiting = 0.0 if self._sent_at is None else time.perf_counter() - self._sent_at
            slowest, self._slowest = max(self._slowest, waiting), 0.0
        return slowest

    def settle(self, timeout_s: float = 60) -> None:
        """Returns once a new poll is answered within IDLE_POLLS idle polls' time: a burst of load
        on the machine (or the loop's leftover work) is over."""
        idle = freeze_bound(0.0, self._interval_s, self.baseline_s)
        deadline = time.perf_counter() + timeout_s
        with self._lock:
            seen = self.polls
        while time.perf_counter() < deadline:
            self._closed.wait(self._interval_s)
            with self._lock:
                if self.polls > seen and self._last_s <= idle:
                    return

    def freeze(self, request_s: float, what: str) -> str | None:
        """Why the polls since the last call say the loop froze around a request of
        `request_s` (`what`), or None; a poll that failed or was refused fails at once."""
        stall = self.slowest()
        assert not self.failures, f"/health/live failed: {self.failures}"
        if stall <= freeze_bound(request_s, self._interval_s, self.baseline_s):
            return None
        return (
            f"/health/live waited {stall * 1000:.0f} ms around {what}: past half its "
            f"{request_s * 1000:.0f} ms and {IDLE_POLLS} idle polls (the slowest idle answer "
            f"{self.baseline_s * 1000:.0f} ms)"
        )
