"""What a client framework sent: the JSON body of each request to `/v1/...`, read where every
client here sends it (httpx's transports, and httpx2's, which the openai SDK uses), unchanged."""

from __future__ import annotations

import json
from typing import Any

import httpx
import httpx2
import pytest


class Wire(list[dict[str, Any]]):
    """The bodies in the order sent."""


def recording(monkeypatch: pytest.MonkeyPatch) -> Wire:
    wire = Wire()

    def keep(request: httpx.Request | httpx2.Request) -> None:
        if request.url.path.startswith("/v1/") and request.content:
            wire.append(json.loads(request.content))

    for module in (httpx, httpx2):
        send, send_async = (
            module.HTTPTransport.handle_request,
            module.AsyncHTTPTransport.handle_async_request,
        )

        def handle(self, request, send=send):
            request.read()
            keep(request)
            return send(self, request)

        async def handle_async(self, request, send_async=send_async):
            await request.aread()
            keep(request)
            return await send_async(self, request)

        monkeypatch.setattr(module.HTTPTransport, "handle_request", handle)
        monkeypatch.setattr(module.AsyncHTTPTransport, "handle_async_request", handle_async)
    return wire
