"""The API key check: one rule for HTTP headers and gRPC metadata, and which tenant it names."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

from ferry.server.errors import MalformedRequest, Unauthorized


class KeyRing:
    """The configured API keys by tenant name; empty when the server has none."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._keys = [(name, key.encode()) for name, key in keys.items()]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def identify(self, values: Sequence[bytes]) -> str:
        """The tenant whose key `Authorization: Bearer <key>` carries (the scheme in any case,
        RFC 9110 section 11.1). Two Authorization headers are refused (400) rather than one
        picked: whichever a proxy in front would have read, Ferry must not read another."""
        if len(values) > 1:
            raise MalformedRequest(
                f"{len(values)} Authorization headers; send one", "authorization"
            )
        scheme, _, credentials = (values[0] if values else b"").partition(b" ")
        credentials = credentials.strip(b" ")
        found = None
        # compare_digest against every key: the time taken says nothing about any of them.
        for name, key in self._keys:
            if hmac.compare_digest(credentials, key) and found is None:
                found = name
        if found is None or scheme.lower() != b"bearer":
            raise Unauthorized()
        return found
