"""Engine log probabilities rendered in OpenAI's two shapes: chat's `content` list and the
legacy completions lists (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ferry.llm.base import TokenLogprob
from ferry.server.openai.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)

Decode = Callable[[list[int]], str]


def chat_logprobs(entries: Sequence[TokenLogprob], decode: Decode) -> ChatLogprobs:
    def top(token_id: int, logprob: float) -> TopLogprob:
        text = decode([token_id])
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

    content = [
        ChatTokenLogprob(
            **top(e.token_id, e.logprob).model_dump(),
            top_logprobs=[top(i, lp) for i, lp in e.top],
        )
        for e in entries
    ]
    return ChatLogprobs(content=content)


def completion_logprobs(
    ids: Sequence[int],
    entries: Sequence[TokenLogprob | None],
    decode: Decode,
    text_offset: int,
) -> CompletionLogprobs:
    """`ids[i]` is the token of `entries[i]` (None: no probability, the prompt's first token)."""
    result = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for token_id, entry in zip(ids, entries, strict=True):
        text = decode([token_id])
        result.tokens.append(text)
        result.text_offset.append(text_offset)
        text_offset += len(text)
        if entry is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        result.token_logprobs.append(entry.logprob)
        alternatives: dict[str, float] = {}
        for alt_id, logprob in entry.top:
            alt = decode([alt_id])
            # Two ids may decode to the same text: the likelier is kept, as it comes first.
            alternatives.setdefault(alt, logprob)
        result.top_logprobs.append(alternatives)
    return result
