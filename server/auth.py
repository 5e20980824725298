"""The API key check: one rule for HTTP headers and gRPC metadata."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from ferry.server.errors import MalformedRequest, Unauthorized


def check_bearer(values: Sequence[bytes], key: bytes) -> None:
    """Pass `Authorization: Bearer <key>`, the scheme in any case (RFC 9110 section 11.1).
    Two Authorization headers are refused (400) rather than one picked: whichever a proxy
    in front would have read, Ferry must not read another."""
    if len(values) > 1:
        raise MalformedRequest(f"{len(values)} Authorization headers; send one", "authorization")
    scheme, _, credentials = (values[0] if values else b"").partition(b" ")
    # compare_digest on every path: the time taken says nothing about the key.
    matches = hmac.compare_digest(credentials.strip(b" "), key)
    if not (matches and scheme.lower() == b"bearer"):
        raise Unauthorized()
