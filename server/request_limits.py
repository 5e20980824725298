"""Per-request bounds shared by every inference route."""

from __future__ import annotations

from collections.abc import Sequence

from ferry.batcher import TokenSequence
from ferry.batcher.errors import InvalidInput
from ferry.server.settings import Settings


def check_request_size(sequences: Sequence[TokenSequence], settings: Settings, field: str) -> None:
    """Items and tokens per request are bounded, so one request cannot take the whole queue."""
    if len(sequences) > settings.max_items_per_request:
        raise InvalidInput(
            field, f"{len(sequences)} items; at most {settings.max_items_per_request} per request"
        )
    tokens = sum(seq.length for seq in sequences)
    if tokens > settings.max_tokens_per_request:
        raise InvalidInput(
            field, f"{tokens} tokens; at most {settings.max_tokens_per_request} per request"
        )
