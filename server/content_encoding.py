"""HTTP compression, as Triton serves it (tritonclient's `request_compression_algorithm` and
`response_compression_algorithm`).

A request body sent with `Content-Encoding: gzip` or `deflate` is inflated before anything reads
it, its inflated size bounded by `max_body_bytes` while inflating: a zip bomb is a 413 after at
most that many bytes (and one chunk) of output, never a body held whole. Any other coding is a
415 decided before the body is read. Where the route table says so (KServe infer), an answer is
compressed when the request's `Accept-Encoding` takes gzip or deflate.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

from ferry.server.errors import BodyTooLarge, MalformedRequest, UnsupportedEncoding
from ferry.server.large_bodies import decoded
from ferry.server.replies import Reply

ENCODINGS = ("gzip", "deflate")
IDENTITY = "identity"
HEADER = "Content-Encoding"
CHUNK = 256 * 1024  # inflated bytes per step: the most a step can pass the limit by
# A compressed body is weighed as this many times its size when choosing to inflate it off
# the event loop (large_bodies.py): it grows about that much, and zlib releases the GIL.
INFLATION = 16
MIN_COMPRESSED_REPLY = 1024  # smaller answers go as they are: the header would eat the saving
LEVEL = 1  # zlib's fastest: most of the saving for a fraction of the time of its default (6)


def request_encoding(header: bytes) -> str | None:
    """The body's coding: None for none (or identity), else gzip or deflate; any other (or a
    stack of them) is refused."""
    given = header.decode("latin-1").strip().lower()
    if given in ("", IDENTITY):
        return None
    if given in ENCODINGS:
        return given
    raise UnsupportedEncoding(given, ENCODINGS)


async def inflated(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` inflated, at most `limit` bytes (BodyTooLarge past it)."""
    return await decoded(len(body) * INFLATION, lambda: inflate(body, encoding, limit))


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(_window_bits(body, encoding))
    parts: list[bytes] = []
    size = 0
    pending = body
    try:
        while not inflater.eof:
            part = inflater.decompress(pending, CHUNK)
            pending = inflater.unconsumed_tail
            if not part and not pending:
                raise MalformedRequest(f"the {encoding} body ends before its stream does", HEADER)
            size += len(part)
            if size > limit:
                raise BodyTooLarge(limit)
            parts.append(part)
    except zlib.error as exc:
        raise MalformedRequest(f"the body is not valid {encoding}: {exc}", HEADER) from None
    if inflater.unused_data:
        raise MalformedRequest(f"bytes after the end of the {encoding} stream", HEADER)
    return b"".join(parts)


def _window_bits(body: bytes, encoding: str) -> int:
    if encoding == "gzip":
        return 16 + zlib.MAX_WBITS
    # HTTP's deflate is zlib's format (tritonclient's zlib.compress); a raw deflate stream, as
    # some clients send, has no zlib header (a method byte of 8 and a checksum of the two bytes).
    zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
    return zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS


def accepted_encoding(header: bytes) -> str | None:
    """The coding to answer in: gzip or deflate where `Accept-Encoding` takes it (q > 0),
    gzip first; None for neither."""
    taken = set()
    for item in header.decode("latin-1").lower().split(","):
        coding, _, parameters = item.partition(";")
        quality = parameters.strip().removeprefix("q=")
        try:
            refused = parameters.strip().startswith("q=") and float(quality) <= 0
        except ValueError:
            refused = True
        if not refused:
            taken.add(coding.strip())
    return next((coding for coding in ENCODINGS if coding in taken), None)


async def compressed(reply: Reply, encoding: str) -> Reply:
    """`reply` in `encoding`, said in its headers (a small one as it is)."""
    if len(reply.body) < MIN_COMPRESSED_REPLY:
        return reply
    body = await decoded(len(reply.body), lambda: compress(reply.body, encoding))
    headers = (*reply.headers, (b"content-encoding", encoding.encode()))
    return replace(reply, body=body, headers=(*headers, (b"vary", b"accept-encoding")))


def compress(data: bytes, encoding: str) -> bytes:
    bits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    deflater = zlib.compressobj(LEVEL, zlib.DEFLATED, bits)
    return deflater.compress(data) + deflater.flush()
