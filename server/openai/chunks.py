"""The SSE events of one streamed response, for either endpoint: the endpoint only says how one
streamed choice looks (a chunk factory), the rest is shared."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ferry.llm.base import GenerationDelta
from ferry.server.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionStreamChoice,
    CompletionChunk,
    CompletionStreamChoice,
    DeltaMessage,
    FinishReasonField,
    UsageInfo,
    dump_chunk,
)
from ferry.server.openai.sse import TextTemplate, sse_data

# (index, text, finish_reason, logprobs) -> the endpoint's stream choice model
ChoiceFactory = Callable[[int, str, FinishReasonField, Any], Any]
# A delta's log probabilities in the endpoint's shape (None: the request asked for none)
LogprobsRenderer = Callable[[GenerationDelta], Any]


class StreamChunks:
    """Renders deltas, the usage and the opening events of one response as SSE text."""

    def __init__(
        self,
        chunk_cls: type[ChatCompletionChunk] | type[CompletionChunk],
        choice: ChoiceFactory,
        *,
        response_id: str,
        model: str,
        opening: Sequence[Any] = (),
        logprobs: LogprobsRenderer | None = None,
    ) -> None:
        self._chunk_cls = chunk_cls
        self._choice = choice
        self._logprobs = logprobs
        self._base: dict[str, Any] = {
            "id": response_id,
            "created": int(time.time()),
            "model": model,
        }
        self._templates: dict[int, TextTemplate] = {}
        self._running: UsageInfo | None = None  # on every chunk (vLLM's continuous_usage_stats)
        self.opening = "".join(self._event([c]) for c in opening)  # one event per choice

    def delta(self, index: int, delta: GenerationDelta) -> str:
        """The events for one delta of choice `index`; empty when it carries nothing to send."""
        if self._logprobs is not None and delta.logprobs:
            logprobs = self._logprobs(delta)  # per chunk: no shared text template
            return self._event([self._choice(index, delta.text, delta.finish_reason, logprobs)])
        if delta.finish_reason is not None:
            return self._event([self._choice(index, delta.text, delta.finish_reason, None)])
        if not delta.text:
            return ""
        if self._running is not None:  # a usage of its own in each: no shared template
            return self._event([self._choice(index, delta.text, None, None)])
        template = self._templates.get(index)
        if template is None:  # pydantic renders each choice's text event once, then it is filled
            chunk = self._chunk([self._choice(index, TextTemplate.SENTINEL, None, None)])
            template = self._templates[index] = TextTemplate(dump_chunk(chunk))
        return template.fill(delta.text)

    def usage(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> str:
        return self._event([], UsageInfo.of(prompt_tokens, completion_tokens, cached_tokens))

    def running_usage(self, usage: UsageInfo) -> None:
        """The usage so far, sent on every chunk from now on (vLLM's continuous_usage_stats)."""
        self._running = usage

    def event(self, choices: list[Any]) -> str:
        """One chunk of these choices, rendered in full (for deltas other than text)."""
        return self._event(choices)

    def _chunk(self, choices: list[Any], usage: UsageInfo | None = None) -> Any:
        return self._chunk_cls(**self._base, choices=choices, usage=usage or self._running)

    def _event(self, choices: list[Any], usage: UsageInfo | None = None) -> str:
        return sse_data(dump_chunk(self._chunk(choices, usage)))


def chat_chunks(
    response_id: str, model: str, n: int, logprobs: LogprobsRenderer | None = None
) -> StreamChunks:
    def choice(
        index: int, text: str, finish: FinishReasonField, lp: Any
    ) -> ChatCompletionStreamChoice:
        return ChatCompletionStreamChoice(
            index=index, delta=DeltaMessage(content=text or None), logprobs=lp, finish_reason=finish
        )

    # OpenAI opens every choice with the role.
    opening = [
        ChatCompletionStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
        for i in range(n)
    ]
    return StreamChunks(
        ChatCompletionChunk,
        choice,
        response_id=response_id,
        model=model,
        opening=opening,
        logprobs=logprobs,
    )


def completion_chunks(response_id: str, model: str) -> StreamChunks:
    def choice(
        index: int, text: str, finish: FinishReasonField, _lp: Any
    ) -> CompletionStreamChoice:
        return CompletionStreamChoice(index=index, text=text, finish_reason=finish)

    return StreamChunks(CompletionChunk, choice, response_id=response_id, model=model)
