"""Polling a condition a server process makes true, bounded so that a bug fails instead of hangs."""

from __future__ import annotations

import time

import httpx


def wait_until(check, timeout_s: float, what: str, interval_s: float = 0.2):
    """`check()`'s first truthy value; HTTP and OS errors count as not yet (a server starting)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not reached within {timeout_s}s (last: {last!r})")
