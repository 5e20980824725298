"""A generation's deltas relayed as a stream's text events: the Responses API's and the Anthropic
Messages API's streams share the loop, each with its own event shapes around it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass

from ferry.llm.base import FinishReason, GenerationDelta
from ferry.server.openai.streams import Deltas


@dataclass
class Relayed:
    """What the closing events say: the tokens generated and why the generation ended."""

    tokens: int = 0
    finish: FinishReason | None = None


async def relay_text(
    first: tuple[int, GenerationDelta],
    deltas: Deltas,
    text: Callable[[str], Iterable[str]],
    relayed: Relayed,
) -> AsyncIterator[str]:
    """`first` (awaited by the caller, so early errors are HTTP errors) and the rest of `deltas`
    as `text`'s events; closing this closes `deltas`, which aborts the generation."""
    async with aclosing(deltas):
        item = first
        while True:
            _, delta = item
            relayed.tokens += delta.token_count
            relayed.finish = delta.finish_reason or relayed.finish
            for event in text(delta.text):
                yield event
            try:
                item = await anext(deltas)
            except StopAsyncIteration:
                break
