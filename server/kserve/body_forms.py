"""JSON bodies that repeat one read before but for the items of its one `data` array: the new
items read without parsing the rest of the body again.

Why: a client sends a tabular model the same JSON but for the numbers (its input's name, shape
and datatype, the outputs it wants, its id); parsing the whole body into dicts and checking each
key (turn_groups.read_plain) was a fifth of a request's CPU in the process. A body that is byte
for byte one read before but for the text between its data's brackets is that request with
these items: JSON reads a value the same wherever it stands, and the text between is read as
one flat array by the same JSON reader.

A body's form is kept only where its text names `data` once and escapes no character as
\\uXXXX: a key written with escapes, or named twice, could make the bracketed text another
value than the one the parsed body reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

DATA_KEY = b'"data"'
BLANKS = b" \t\r\n"


@dataclass(frozen=True, slots=True)
class BodyForm:
    before: bytes  # the body through its data's "["
    after: bytes  # from its "]" to the end
    reading: Any  # what the body read as, but for its data (turn_groups.Member's parts)

    def items_of(self, body: bytes) -> list[Any] | None:
        """The items of `body`'s data where it has this form, as one flat JSON array; None
        where it has not (or its items are not one flat array)."""
        if len(self.before) + len(self.after) > len(body):
            return None  # its start and end would overlap
        if not body.startswith(self.before) or not body.endswith(self.after):
            return None
        inner = body[len(self.before) : len(body) - len(self.after)]
        if b"[" in inner:
            return None
        try:
            items = orjson.loads(b"[" + inner + b"]")
        except orjson.JSONDecodeError:
            return None
        return items if type(items) is list else None


def body_form(body: bytes, reading: Any) -> BodyForm | None:
    """The form of `body`, whose one `data` array is flat, with what it read as; None where it
    may not be kept (see the module's docstring)."""
    start = body.find(DATA_KEY)
    if start < 0 or body.find(DATA_KEY, start + 1) >= 0 or b"\\u" in body:
        return None
    at = _skip_blanks(body, start + len(DATA_KEY))
    if body[at : at + 1] != b":":
        return None
    at = _skip_blanks(body, at + 1)
    if body[at : at + 1] != b"[":
        return None
    close = body.find(b"]", at)
    if close < 0 or body.find(b"[", at + 1, close) >= 0:
        return None  # nested lists: not kept
    return BodyForm(body[: at + 1], body[close:], reading)


def _skip_blanks(body: bytes, at: int) -> int:
    while body[at : at + 1] and body[at : at + 1] in BLANKS:
        at += 1
    return at
