"""The batcher's own exceptions. `server/errors.py` maps each to an HTTP status in one table."""

from __future__ import annotations


class BatcherError(Exception):
    """Base of every error a batcher future can carry."""


class QueueFull(BatcherError):
    """The bounded queue has no room: refused at once rather than left to time out later."""

    def __init__(
        self, retry_after_s: float, message: str = "the model's queue is full; retry later"
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(BatcherError):
    """The request's deadline passed before its result was ready."""


class BatcherClosed(BatcherError):
    """The batcher is draining or stopped and takes no new work."""


class BatchAbandoned(BatcherError):
    """The batcher stopped before this request could run (drain timeout passed)."""


class InferenceFailed(BatcherError):
    """The backend failed on this request (after it was retried alone)."""


class BatchWideFailure(Exception):
    """Marker base for backend errors that no single request caused (backend down, timed out).

    The batcher fails every member with the error instead of retrying members one by one.
    """


class InferenceTimedOut(BatchWideFailure, BatcherError):
    """The backend did not answer within the model's inference timeout (maps to 504)."""
