"""Where a body that is not valid JSON goes wrong, so that its 4xx names the field (`param`).

Only error paths come here. The scan runs on C-speed regex tokens over a bounded prefix of the
body: a hostile body cannot make a refusal expensive.
"""

from __future__ import annotations

import re

# jiter (pydantic) and orjson put the place of the fault in their message.
_POSITION = re.compile(r"line (\d+) column (\d+)")
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}:,]')
_SCAN_LIMIT = 256 * 1024  # bytes scanned for the field; past it the key is named, not the index
MAX_DEPTH = 256  # deeper than any request of these protocols needs
MAX_KEY_CHARS = 64
_LINE_BLOCK = 4096  # bytes whose newlines are counted in one call


def json_error(body: bytes, message: str, position: int | None = None) -> tuple[str | None, str]:
    """The field a parser's complaint about `body` is in, and the complaint in plain words."""
    position = _position(body, message) if position is None else position
    if "hex escape" in message or "surrogate" in message:
        message = "a lone surrogate escape (such as \\ud800) is not Unicode text"
    elif "recursion" in message:
        message = "nested too deeply"
    return field_at(body, position), message


def field_at(body: bytes, stop: int | None = None, max_depth: int = MAX_DEPTH) -> str | None:
    """The top-level key (with the index, when its value is a list) holding byte `stop`, or, with
    no `stop`, where nesting first goes deeper than `max_depth`. None outside any key."""
    end = len(body) if stop is None else stop
    window = body[: min(end + 1, _SCAN_LIMIT)]
    depth, key, index = 0, None, None
    last_string: bytes | None = None
    for match in _TOKENS.finditer(window):
        token = match.group()
        if token[:1] == b'"':
            last_string = token
        elif token in b"[{":
            depth += 1
            if depth == 2 and token == b"[" and key is not None:
                index = 0
            if depth > max_depth and stop is None:
                return _named(key, index)
        elif token in b"]}":
            depth -= 1
        elif token == b":" and depth == 1 and last_string is not None:
            key, index = _key(last_string), None
        elif token == b"," and depth == 2 and index is not None:
            index += 1
        elif token == b"," and depth == 1:
            key, index = None, None
    if stop is None:
        return None
    return _named(key, index if end < _SCAN_LIMIT else None)


def _named(key: str | None, index: int | None) -> str | None:
    return key if key is None or index is None else f"{key}[{index}]"


def _key(token: bytes) -> str:
    return token.strip(b'"').decode("utf-8", "replace")[:MAX_KEY_CHARS]


def _position(body: bytes, message: str) -> int | None:
    found = _POSITION.search(message)
    if found is None:
        return None
    line, column = int(found.group(1)), int(found.group(2))
    start = _line_start(body, line)
    return None if start is None else start + max(column - 1, 0)


def _line_start(body: bytes, line: int) -> int | None:
    """Where 1-based `line` starts. Newlines are counted a block at a time (C's memchr), and
    found one by one only in the last block: 4 MB of newlines is ~1,000 steps, not 4 million."""
    skip, start = line - 1, 0
    while skip and start < len(body):
        block = body.count(b"\n", start, start + _LINE_BLOCK)
        if block >= skip:
            break
        skip -= block
        start += _LINE_BLOCK
    for _ in range(skip):
        start = body.find(b"\n", start) + 1
        if start == 0:
            return None
    return start
