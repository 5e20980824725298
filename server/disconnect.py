"""Wait for batcher futures, but give up (and drop the queued work) if the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    pass


async def _until_disconnected(request: Request) -> None:
    # The body is already read, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def gather_unless_disconnected(
    request: Request, futures: Sequence[asyncio.Future]
) -> list[Any]:
    """All the futures' results; a client that leaves first has its queued items dropped."""
    try:
        return await run_unless_disconnected(request, asyncio.gather(*futures))
    finally:
        # Cancelling drops queued items before they reach the backend (after one failed, or
        # the client left); finished ones are unaffected.
        for future in futures:
            future.cancel()


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
