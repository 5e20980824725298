"""One future per request that resolves when its client goes away, and what the gateway does
with it: cancel the request's handler, which drops its queued work or aborts its generation."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Scope

# Set by Ferry's HTTP protocol (`connection_limits.py`): resolved from `connection_lost`.
DISCONNECTED = "ferry.disconnected"


class ClientDisconnected(Exception):
    """The client went away before its answer was ready; its queued work was dropped."""


def disconnect_future(
    scope: Scope, receive: Receive
) -> tuple[asyncio.Future[None], asyncio.Task[None] | None]:
    """The request's disconnect future. Ferry's protocol hands one over for free; under any
    other server (tests over httpx's ASGI transport) a task listening on `receive` stands in,
    returned so that the caller can cancel it. Only call once the body is read: after that a
    disconnect is the only message that can arrive."""
    given: asyncio.Future[None] | None = scope.get("extensions", {}).get(DISCONNECTED)
    if given is not None:
        return given, None
    watcher = asyncio.ensure_future(_until_disconnect(receive))
    return watcher, watcher


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class CancelOnDisconnect:
    """A done-callback for the disconnect future that cancels the handler's task, while armed.
    Disarmed before the task leaves the handler, so a late callback cancels nothing else."""

    __slots__ = ("_task", "armed")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self.armed = True

    def __call__(self, _: asyncio.Future[None]) -> None:
        if self.armed:
            self._task.cancel()
