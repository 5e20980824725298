"""Large request bodies decoded off the event loop.

orjson and numpy hold the GIL through each call, but a thread hands it back between calls: a
4 MB JSON tensor (~50 ms of parsing and type checks on this CPU) then stalls the loop for its
longest single call (~20 ms) instead of for all of it (issue 35: nothing one request sends may
freeze the loop for more than 50 ms). Small bodies are decoded in place: a thread hop costs more
than they do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

LARGE_BODY_BYTES = 256 * 1024


async def decoded(body_bytes: int, decode: Callable[[], T]) -> T:
    """`decode()`, in a worker thread when the body is large."""
    if body_bytes < LARGE_BODY_BYTES:
        return decode()
    return await asyncio.to_thread(decode)
