"""Large request bodies decoded off the event loop.

orjson and numpy hold the GIL through each call, but a thread hands it back between calls: a
4 MB JSON tensor (~50 ms of parsing and type checks on this CPU) then stalls the loop for its
longest single call (~20 ms) instead of for all of it (issue 35: nothing one request sends may
freeze the loop for more than 50 ms). Small bodies are decoded in place: a thread hop costs more
than they do.

One thread decodes them all, in turn: the GIL lets only one decode at a time anyway, and each
more thread wanting it is one more that the event loop queues behind for the GIL (64 clients
of 1 MB image tensors: six of asyncio's default threads decoding at once).

JSON tensor bodies this large (KServe v2's, and /predict's for plain graphs) are parsed in a
worker process first (json_bodies.py): what is left for the thread is checking arrays.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

T = TypeVar("T")

LARGE_BODY_BYTES = 256 * 1024


async def decoded(body_bytes: int, decode: Callable[[], T]) -> T:
    """`decode()`, in a worker thread when the body is large."""
    if body_bytes < LARGE_BODY_BYTES:
        return decode()
    context = contextvars.copy_context()  # as asyncio.to_thread does
    return await asyncio.get_running_loop().run_in_executor(_decoder(), context.run, decode)


@cache
def _decoder() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="ferry-bodies")
