"""OpenAI-compatible request/response schemas (shaped after vLLM's protocol, but Ferry's own).

Fields follow OpenAI's documented order. Requests accept unknown fields and log them at debug, so
clients sending newer OpenAI parameters are not rejected; responses are strict.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Annotated, Any, Literal

from ferry.llm.base import SamplingSettings
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

log = logging.getLogger(__name__)

MAX_N = 8
# Stop strings are matched against every decoded delta of a stream: bounded so that one request
# cannot slow every other stream in the engine step (vLLM has no bound; OpenAI allows 4).
MAX_STOP = 16
MAX_STOP_CHARS = 256
StopString = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]
Prompt = Annotated[str, StringConstraints(min_length=1)]


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _now() -> int:
    return int(time.time())


class OpenAIRequestModel(BaseModel):
    """Base for requests: unknown fields are accepted and logged, never an error."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _log_unknown_fields(self) -> OpenAIRequestModel:
        if self.model_extra:
            log.debug(
                "ignoring unknown fields in %s: %s", type(self).__name__, sorted(self.model_extra)
            )
        return self


class TextContentPart(OpenAIRequestModel):
    type: Literal["text"]
    text: str


class ChatMessageParam(OpenAIRequestModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class StreamOptions(OpenAIRequestModel):
    include_usage: bool = False


class _SamplingFields(OpenAIRequestModel):
    """The sampling parameters chat and completions share, with OpenAI's ranges."""

    n: int = Field(default=1, ge=1, le=MAX_N)
    seed: int | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _settings(self, max_tokens: int) -> SamplingSettings:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingSettings(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop,
        )


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessageParam] = Field(min_length=1)
    model: str
    max_tokens: int | None = Field(default=None, ge=1)  # deprecated by OpenAI, still common
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def chat_messages(self) -> list[dict[str, str]]:
        """Messages with content parts flattened to text, as chat templates expect."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def to_sampling(self, default_max_tokens: int) -> SamplingSettings:
        """Engine settings; without a limit, generate up to the room left in the context."""
        limit = self.max_completion_tokens or self.max_tokens or default_max_tokens
        return self._settings(limit)


class CompletionRequest(_SamplingFields):
    model: str
    prompt: Prompt | Annotated[list[Prompt], Field(min_length=1)]
    max_tokens: int = Field(default=16, ge=1)  # OpenAI's legacy default

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def to_sampling(self, default_max_tokens: int | None = None) -> SamplingSettings:
        return self._settings(self.max_tokens)


# -- responses --------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


FinishReasonField = Literal["stop", "length", "abort"] | None


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: None = None
    finish_reason: FinishReasonField


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: _id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: FinishReasonField = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None  # only on the last chunk, when stream_options.include_usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReasonField


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: _id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReasonField = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionStreamChoice]
    usage: UsageInfo | None = None


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def new_chat_id() -> str:
    return _id("chatcmpl")


def new_completion_id() -> str:
    return _id("cmpl")


def dump_chunk(chunk: ChatCompletionChunk | CompletionChunk) -> dict[str, Any]:
    """A chunk as OpenAI streams it: usage only when present, deltas without null fields."""
    body = chunk.model_dump()
    if body["usage"] is None:
        del body["usage"]
    for choice in body["choices"]:
        if "delta" in choice:
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    return body
