"""The request id: the client's `x-request-id` when it is safe to write into a log line, else a
new one; held in a context variable for the request's log lines (server/logs.py) and returned
in the response (the gateway; gRPC's trailing metadata).

Read once per request: a header scan, a regex match and a context variable set; an id is made
(128 random bits as hex) only when the client sent none that can be used.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any, Protocol

HEADER = b"x-request-id"
METADATA_KEY = "x-request-id"  # gRPC metadata keys are lower-case
MAX_LENGTH = 128
# Printable token characters only: no space, quote, control character or newline can reach a log
# line. Enough for UUIDs, W3C trace ids, base64 and the ids proxies make (Envoy, nginx, Heroku).
_SAFE = re.compile(rb"[A-Za-z0-9._~:/+=@-]{1,%d}" % MAX_LENGTH)

# The id of the request the running task handles (None outside a request).
current: ContextVar[str | None] = ContextVar("ferry_request_id", default=None)


def new_id() -> bytes:
    # 128 random bits, unique enough for an id (no secret rides on it); not os.urandom, whose
    # syscall hands the GIL away: with a backend thread that launches kernels waiting for it,
    # the event loop then waited out that thread's launch for every request id it made.
    return b"%032x" % random.getrandbits(128)


def from_client(sent: bytes) -> bytes:
    """`sent` (a header's value, b"" when absent) when it is safe to log, else a new id."""
    return safe(sent) or new_id()


def safe(sent: bytes) -> bytes:
    """`sent` (a header's value, b"" when absent) when it is safe to log, else b""."""
    return sent if sent and _SAFE.fullmatch(sent) else b""


def of_headers(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The id of a request with these raw (lower-cased) HTTP headers: its own, or a new one."""
    return from_client(next((value for key, value in headers if key == HEADER), b""))


class GrpcContext(Protocol):
    """What is used of a grpc.aio.ServicerContext (grpcio is imported only when gRPC is on)."""

    def invocation_metadata(self) -> Any: ...
    def set_trailing_metadata(self, trailing_metadata: Any) -> None: ...


def bind_grpc(context: GrpcContext) -> str:
    """A gRPC call's id, from its `x-request-id` metadata: set for its log lines and put in its
    trailing metadata (trailers set later extend it, they do not replace it)."""
    metadata = context.invocation_metadata() or ()
    sent = next((value for key, value in metadata if key == METADATA_KEY), "")
    raw = sent.encode("latin-1", "replace") if isinstance(sent, str) else bytes(sent)
    request_id = from_client(raw).decode("ascii")
    current.set(request_id)
    context.set_trailing_metadata(((METADATA_KEY, request_id),))
    return request_id


__all__ = ["HEADER", "MAX_LENGTH", "bind_grpc", "current", "from_client", "new_id", "of_headers"]
