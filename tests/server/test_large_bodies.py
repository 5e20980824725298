"""A large body is decoded in a worker thread (the event loop keeps the GIL between its calls);
a small one in place, where a thread hop would cost more than the decoding."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ferry.server.large_bodies import LARGE_BODY_BYTES, decoded

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("body_bytes", "off_loop"), [(LARGE_BODY_BYTES - 1, False), (LARGE_BODY_BYTES, True)]
)
async def test_large_bodies_are_decoded_off_the_loop(body_bytes, off_loop):
    loop_thread = threading.get_ident()
    thread = await decoded(body_bytes, threading.get_ident)
    assert (thread != loop_thread) is off_loop


async def test_a_decoding_error_reaches_the_caller():
    def refuse() -> None:
        raise ValueError("bad tensor")

    with pytest.raises(ValueError, match="bad tensor"):
        await decoded(LARGE_BODY_BYTES, refuse)


async def test_large_bodies_decode_in_turn_in_one_thread():
    """Decoding holds the GIL: more threads would only queue the event loop behind more of them."""

    def decode() -> int:
        time.sleep(0.01)  # still decoding when the next body arrives
        return threading.get_ident()

    threads = await asyncio.gather(*(decoded(LARGE_BODY_BYTES, decode) for _ in range(3)))
    assert len(set(threads)) == 1
