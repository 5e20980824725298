"""Await work, but give up (and drop the queued work) if the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client went away before its answer was ready; its queued work was dropped."""


async def _until_disconnected(request: Request) -> None:
    # The body is already read, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_unless_disconnected(request: Request, coro: Awaitable[T]) -> T:
    """Await `coro`; if the client goes away first, cancel it (aborting its work) instead."""
    work = asyncio.ensure_future(coro)
    watcher = asyncio.create_task(_until_disconnected(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
