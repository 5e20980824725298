"""JSON text carried inside a request (tool-call arguments, a `guided_json` string) nested no
deeper than the body itself may be.

The body parser (pydantic's jiter) refuses a body nested past its recursion limit; JSON inside a
string slips past it, and Python's `json` would later raise RecursionError on it (a 500). This
check refuses it first, with a 400 naming the field.
"""

from __future__ import annotations

import pydantic_core

from ferry.llm.errors import InvalidSampling

# jiter's own limit (pydantic's body parser): the same bound for JSON in a string as in a body.
MAX_JSON_DEPTH = 200


def check_json_depth(text: str, field: str) -> None:
    """InvalidSampling naming `field` when `text` is JSON nested deeper than MAX_JSON_DEPTH.
    Text that is not JSON at all passes: whoever reads it decides what that means."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return  # too few brackets to nest that deep: nothing to parse
    try:
        pydantic_core.from_json(text)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise InvalidSampling(
                field, f"{field} is JSON nested deeper than {MAX_JSON_DEPTH} levels"
            ) from None
