"""Server-sent events as the OpenAI ecosystem frames them."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"


def sse_data(payload: dict[str, Any]) -> str:
    """One `data:` event; compact JSON never contains a raw newline, so one line suffices."""
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


class TextTemplate:
    """An SSE event whose body pydantic rendered once, with one string left open.

    Streaming sends one event per token; building and dumping a pydantic model for each costs
    more than the tiny model's decoding step. The template is rendered through the same models
    (a sentinel in place of the text), so the bytes match what the slow path would send.
    """

    SENTINEL = "\x00ferry-text\x00"

    def __init__(self, payload: dict[str, Any]) -> None:
        rendered = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        marker = json.dumps(self.SENTINEL, ensure_ascii=False)
        self._before, self._after = rendered.split(marker)

    def fill(self, text: str) -> str:
        return f"data: {self._before}{json.dumps(text, ensure_ascii=False)}{self._after}\n\n"
