"""Server-sent events as the OpenAI ecosystem frames them."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"


def sse_data(payload: dict[str, Any]) -> str:
    """One `data:` event; compact JSON never contains a raw newline, so one line suffices."""
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"
