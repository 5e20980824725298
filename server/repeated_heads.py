"""A connection's last request the direct lane served, kept so that its next request with the same
head is served without parsing that head again.

Why: a client sends the infer route the same head on every request of a connection (method, URL
and headers, all but the body's length where bodies differ). uvicorn's parser calls into Python
for the message, its URL and each header line, and the lane then reads those headers again
(server/direct_lane.py `takes`): on a tabular model, a fifth of a request's CPU in the process
(docs/benchmarks.md). A read that holds exactly one request whose head is, byte for byte, the
last one the lane served, but for the digits of its Content-Length, goes to the lane with that
head's reading; any other read is parsed as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LENGTH_NAME = b"\r\ncontent-length:"
MAX_LENGTH_DIGITS = 10


@dataclass(frozen=True, slots=True)
class RepeatedHead:
    before: bytes  # the head through "Content-Length:" and its spaces
    after: bytes  # the head from the line end after the length's digits to the blank line
    headers: list[tuple[bytes, bytes]]  # as uvicorn read them first (the lane reads the id)
    taken: Any  # as the lane read them first (direct_lane.Taken)

    def body_of(self, data: bytes) -> bytes | None:
        """The body of `data` where it is exactly one request with this head, else None."""
        if not data.startswith(self.before):
            return None
        start = len(self.before)
        end = data.find(b"\r", start, start + MAX_LENGTH_DIGITS + 1)
        if end < 0:
            return None
        digits = data[start:end]
        if not digits.isdigit() or not data.startswith(self.after, end):
            return None
        body = end + len(self.after)
        if len(data) - body != int(digits):
            return None
        return data[body:]


def repeated_head(
    data: bytes, body: bytes, headers: list[tuple[bytes, bytes]], taken: Any
) -> RepeatedHead | None:
    """The head of `data`, a read that held exactly one request, of this body, which the lane
    took as `taken`; None where its length is not one plain Content-Length header."""
    head = data[: len(data) - len(body)]
    if head.find(b"\r\n\r\n") != len(head) - 4:
        return None  # bytes after the body (a stray line end): its head is not the rest
    lowered = head.lower()
    found = lowered.find(LENGTH_NAME)
    if found < 0 or lowered.find(LENGTH_NAME, found + 1) >= 0:
        return None
    start = found + len(LENGTH_NAME)
    while head[start : start + 1] in (b" ", b"\t"):
        start += 1
    end = head.find(b"\r", start)
    if end < 0 or head[start:end] != b"%d" % len(body):
        return None
    return RepeatedHead(head[:start], head[end:], headers, taken)
