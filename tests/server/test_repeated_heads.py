"""A connection's repeated request head (server/repeated_heads.py): a read is served by the last
head only where it is exactly one request with that head, whatever its body's length."""

from __future__ import annotations

import pytest

from ferry.server.repeated_heads import repeated_head

pytestmark = pytest.mark.unit

HEAD = b"POST /v2/models/gb/infer HTTP/1.1\r\nHost: ferry\r\nContent-Length: %s\r\nX: y\r\n\r\n"


def request(body: bytes, length: bytes | None = None) -> bytes:
    return HEAD % (b"%d" % len(body) if length is None else length) + body


FIRST = repeated_head(request(b"abc"), b"abc", [], "taken")


@pytest.mark.parametrize("body", [b"abc", b"", b"a longer body {}"])
def test_the_same_head_gives_its_body_whatever_its_length(body):
    assert FIRST is not None
    assert FIRST.body_of(request(body)) == body


@pytest.mark.parametrize(
    "data",
    [
        request(b"abc") + b"POST",  # a second request begun in the same read
        request(b"abc")[:-1],  # its body unfinished
        request(b"abc", b"4"),  # a length the body does not have
        request(b"abc", b"+3"),  # a length Python reads, that is not digits
        request(b"abc", b"3 "),
        request(b"abc").replace(b"X: y", b"X: z"),  # another header's value
        request(b"abc").replace(b"gb", b"lr"),
        request(b"abc").replace(b"Content-Length: 3\r\n", b"Content-Length: 3\r\nA: b\r\n"),
        request(b"abc").lower(),  # the same request, differently written
    ],
    ids=[
        "pipelined",
        "unfinished",
        "wrong length",
        "signed length",
        "spaced length",
        "a value",
        "the URL",
        "a header more",
        "case",
    ],
)
def test_any_other_read_is_parsed(data):
    assert FIRST is not None
    assert FIRST.body_of(data) is None


@pytest.mark.parametrize(
    "data",
    [
        HEAD.replace(b"Content-Length: %s\r\n", b"") + b"",  # no length: nothing to repeat
        request(b"abc", b"03"),  # a length written otherwise than its digits
        HEAD.replace(b"X: y", b"Content-Length: 3") % b"3" + b"abc",  # two lengths
        request(b"abc") + b"\r\n",  # a line end after the body, which the parser skips
    ],
    ids=["no length", "leading zero", "two lengths", "bytes after the body"],
)
def test_a_head_whose_length_is_not_plain_is_not_kept(data):
    body = b"" if data.startswith(HEAD.replace(b"Content-Length: %s\r\n", b"")) else b"abc"
    assert repeated_head(data, body, [], "taken") is None


def test_the_first_reading_is_kept():
    headers = [(b"host", b"ferry")]
    kept = repeated_head(request(b"abc"), b"abc", headers, "taken")
    assert kept is not None and kept.headers is headers and kept.taken == "taken"
