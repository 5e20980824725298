"""server/request_bodies.py: a large JSON body is parsed, and refused, off the event loop."""

from __future__ import annotations

import threading

import pytest

from ferry.server import request_bodies
from ferry.server.errors import Refused, failure
from ferry.server.large_bodies import LARGE_BODY_BYTES
from ferry.server.schemas import PredictRequest

pytestmark = pytest.mark.unit

NEWLINES = b"\n" * (4 * 2**20 - 1024)  # issue 48: 4 MB of newlines, 0.5 s on the loop to refuse


@pytest.mark.parametrize(
    ("body", "thread"),
    [(b'{"inputs": ', "MainThread"), (NEWLINES, "ferry-bodies"), (b"[" + NEWLINES, "ferry-bodies")],
)
async def test_a_broken_body_is_refused_where_it_was_parsed(monkeypatch, body, thread):
    """The Failure (which scans the body for the field and line) is decided in the body thread
    for a large body, in place for a small one."""
    seen = []
    decide = request_bodies.validation_failure

    def spy(errors):
        seen.append(threading.current_thread().name)
        return decide(errors)

    monkeypatch.setattr(request_bodies, "validation_failure", spy)
    with pytest.raises(Refused) as info:
        await request_bodies.parse_body(PredictRequest, body)
    assert [name.rsplit("_", 1)[0] for name in seen] == [thread]  # pool threads end in _0
    assert (len(body) >= LARGE_BODY_BYTES) == (thread != "MainThread")
    refusal = failure(info.value)
    assert refusal.status == 422 and "Invalid JSON" in refusal.message


async def test_a_valid_large_body_is_parsed():
    body = b'{"inputs": "x"' + b" " * LARGE_BODY_BYTES + b"}"
    assert (await request_bodies.parse_body(PredictRequest, body)).inputs == "x"
