"""Tracing hooks: what the batcher tells a tracer about a traced request's admission and wait, and
about the batch that carries it.

The caller puts a `RequestTracer` in `current` for the request it handles (server/tracing.py:
OpenTelemetry spans); an untraced request (tracing off, or not sampled) has None there, and
costs the batcher one context-variable read at submit and one attribute read per batch member.
The batcher never imports a tracing library.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from types import TracebackType
from typing import Protocol


class BatchSpan(Protocol):
    """One batch's span, open while it is packed, run and scattered."""

    def __enter__(self) -> BatchSpan: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    def formed(self, size: int, padded_length: int, real_tokens: int, padded_tokens: int) -> None:
        """The batch as packed: its rows, padded length and how much of it is padding."""

    def backend(self) -> AbstractContextManager[object]:
        """The backend call, inside the batch's span."""
        ...


class QueueWait(Protocol):
    """A traced request's wait in the queue, from its admission until its batch closes."""

    def batch(self, model: str, members: Sequence[QueueWait]) -> BatchSpan:
        """The span of the batch carrying `members` (traced ones, this one among them), linked to
        each member's request; each member's wait ends as it starts."""
        ...

    def left(self) -> None:
        """The request left the queue (answered, cancelled, expired): its wait ends here unless
        a batch ended it already."""


class RequestTracer(Protocol):
    """The traced request being handled: its admission and its wait."""

    def admission(self) -> AbstractContextManager[object]: ...

    def queued(self) -> QueueWait: ...


# The request the running task handles, when it is traced and sampled.
current: ContextVar[RequestTracer | None] = ContextVar("ferry_request_tracer", default=None)


class _Untraced:
    """A batch none of whose members is traced: every hook does nothing."""

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def formed(self, size: int, padded_length: int, real_tokens: int, padded_tokens: int) -> None:
        return None

    def backend(self) -> _Untraced:
        return self


UNTRACED = _Untraced()


def batch_span(model: str, waits: Sequence[QueueWait | None]) -> BatchSpan:
    """The span of a batch whose members waited as `waits` (None: untraced members)."""
    traced = [wait for wait in waits if wait is not None]
    return traced[0].batch(model, traced) if traced else UNTRACED


__all__ = ["UNTRACED", "BatchSpan", "QueueWait", "RequestTracer", "batch_span", "current"]
