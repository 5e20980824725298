"""A large body is decoded in a worker thread (the event loop keeps the GIL between its calls);
a small one in place, where a thread hop would cost more than the decoding."""

from __future__ import annotations

import threading

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
