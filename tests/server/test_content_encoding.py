"""Request bodies inflated under max_body_bytes while inflating, and answers compressed as the
client accepts (server/content_encoding.py)."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pytest

from ferry.server.content_encoding import (
    accepted_encoding,
    compress,
    inflate,
    request_encoding,
)
from ferry.server.errors import BodyTooLarge, MalformedRequest, UnsupportedEncoding

pytestmark = pytest.mark.unit

BODY = b'{"inputs": []}' * 1000


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        ("gzip", gzip.compress(BODY, mtime=0)),
        ("deflate", zlib.compress(BODY)),  # HTTP's deflate: zlib's format (tritonclient's)
        ("deflate", zlib.compress(BODY, wbits=-15)),  # a raw deflate stream, as some send
    ],
)
def test_each_coding_inflates_to_the_body(encoding, packed):
    assert inflate(packed, encoding, len(BODY)) == BODY


def test_a_body_one_byte_over_the_limit_is_too_large():
    with pytest.raises(BodyTooLarge):
        inflate(gzip.compress(BODY, mtime=0), "gzip", len(BODY) - 1)


def test_a_zip_bomb_is_refused_while_inflating():
    """200 MB of zeros in ~200 KB: refused past the limit with a few megabytes held, never
    inflated whole."""
    bomb = zlib.compressobj(1, zlib.DEFLATED, 31)
    packed = b"".join(bomb.compress(bytes(2**20)) for _ in range(200)) + bomb.flush()
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            inflate(packed, "gzip", 4 * 2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20


@pytest.mark.parametrize(
    ("packed", "says"),
    [
        (gzip.compress(BODY, mtime=0)[:-20], "ends before its stream does"),
        (gzip.compress(BODY, mtime=0) + b"more", "after the end"),
        (b"not gzip at all", "not valid gzip"),
    ],
)
def test_a_broken_stream_is_malformed(packed, says):
    with pytest.raises(MalformedRequest, match=says):
        inflate(packed, "gzip", 2**20)


@pytest.mark.parametrize(
    ("header", "coding"),
    [(b"", None), (b"identity", None), (b"GZIP", "gzip"), (b" deflate ", "deflate")],
)
def test_request_codings(header, coding):
    assert request_encoding(header) == coding


@pytest.mark.parametrize("header", [b"br", b"compress", b"gzip, deflate"])
def test_other_request_codings_are_refused(header):
    with pytest.raises(UnsupportedEncoding, match="gzip, deflate or identity"):
        request_encoding(header)


@pytest.mark.parametrize(
    ("header", "coding"),
    [
        (b"gzip", "gzip"),
        (b"deflate", "deflate"),
        (b"gzip, deflate, br", "gzip"),  # aiohttp's and httpx's default
        (b"gzip;q=0, deflate", "deflate"),
        (b"gzip;q=0", None),
        (b"br, *", None),
        (b"gzip;q=nonsense", None),
    ],
)
def test_accepted_codings(header, coding):
    assert accepted_encoding(header) == coding


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_answers_inflate_to_themselves(coding):
    assert inflate(compress(BODY, coding), coding, len(BODY)) == BODY
