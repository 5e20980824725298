"""OpenAI-compatible request/response schemas (shaped after vLLM's protocol, but Ferry's own).

Fields follow OpenAI's documented order. A request field Ferry does not know is a 400 naming it,
as OpenAI answers; vLLM's extensions are known fields, honoured (request_base.py).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from functools import cached_property
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    field_validator,
)

from ferry.llm.base import FLOAT32_MAX, FLOAT32_TINY, SamplingSettings
from ferry.llm.errors import InvalidSampling
from ferry.server.openai.json_depth import check_json_depth
from ferry.server.openai.request_base import OpenAIRequestModel, RequestBody
from ferry.server.openai.tool_models import (
    DeltaToolCall,
    ResponseFormat,
    ToolCall,
    ToolCallParam,
    ToolChoice,
    ToolParam,
)
from ferry.server.schemas import Priority

MAX_N = 8
# Stop strings are matched against every decoded delta of a stream: bounded so that one request
# cannot slow every other stream in the engine step (vLLM has no bound; OpenAI allows 4).
MAX_STOP = 16
MAX_STOP_CHARS = 256
# OpenAI and vLLM take any int64 seed; beyond it a 400, not a seed silently folded.
SEED_RANGE = {"ge": -(2**63), "le": 2**63 - 1}
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
# vLLM asks for 43+ random characters (256 bits); bounded, as every text is.
CacheSalt = Annotated[StrictStr, StringConstraints(min_length=1, max_length=1024)]
Prompt = NonEmptyStr
Penalty = Annotated[StrictFloat, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
MAX_LOGPROBS = 20
# Parameters Ferry cannot honour, with the values that ask for nothing (accepted): any other
# value is refused with a 400 naming the parameter, never silently ignored.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    # Chat takes tools (fields of ChatCompletionRequest); completions do not.
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    # The legacy, pre-tools function calling.
    "functions": (None, []),
    "function_call": (None, "none"),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
}


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _now() -> int:
    return int(time.time())


class TextContentPart(OpenAIRequestModel):
    type: Literal["text"]
    text: str


class ChatMessageParam(OpenAIRequestModel):
    # `developer` is OpenAI's newer name for `system`; `tool` results go to the template as is.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCallParam] | None = None  # on assistant messages: calls it made
    # OpenAI's other assistant fields, as SDKs send a reply back: accepted when they say nothing
    # (Ferry never writes them), refused by name otherwise.
    refusal: None = None
    audio: None = None
    function_call: None = None

    @cached_property
    def text(self) -> str:
        """The content as one string (parts joined once, whoever asks)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


def template_messages(params: list[ChatMessageParam]) -> list[dict[str, Any]]:
    """Messages with content parts flattened to text, as chat templates expect; an
    assistant's tool calls as `tool_calls` with parsed arguments (transformers' shape)."""
    messages: list[dict[str, Any]] = []
    for m in params:
        message: dict[str, Any] = {
            "role": "system" if m.role == "developer" else m.role,
            "content": m.text,
        }
        if m.tool_calls:
            message["tool_calls"] = [_template_call(call) for call in m.tool_calls]
        if m.role == "tool" and m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    return messages


def _template_call(call: ToolCallParam) -> dict[str, Any]:
    """A call with its arguments as an object, as vLLM hands them to the template: templates
    write them with `tojson`, which would quote the JSON text a second time. Empty arguments
    are `{}` (vLLM's reading); text that is not JSON, or nested past the body's own limit (a
    ValueError here where `json` would recurse out of the stack), stays text."""
    dumped = call.model_dump()
    text = call.function.arguments
    with contextlib.suppress(ValueError):
        dumped["function"]["arguments"] = pydantic_core.from_json(text) if text.strip() else {}
    return dumped


class StreamOptions(OpenAIRequestModel):
    include_usage: StrictBool = False
    # vLLM's extension (guidellm sends it): the usage so far on every chunk, with include_usage.
    continuous_usage_stats: StrictBool = False


class _SamplingFields(RequestBody):
    """The sampling parameters chat and completions share, with OpenAI's ranges."""

    UNSUPPORTED = UNSUPPORTED

    # Strict types: the schema says number/integer/boolean, and lax mode would take `false` as
    # 0 and "1" as 1, running a request that is not what the client wrote.
    n: StrictInt = Field(default=1, ge=1, le=MAX_N)
    seed: StrictInt | None = Field(default=None, **SEED_RANGE)  # type: ignore[misc, call-overload]  # mypy cannot match ** to Field's keywords
    # Bounds checked by `_bounded_stop`, whose messages say which (a union's would not).
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # NaN and infinities: "should be a finite number", not "should be <= 2".
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    user: str | None = None
    # vLLM's extension: queued requests with a lower number are admitted first.
    priority: Priority = 0
    # vLLM's extension: prefix reuse only with requests of the same salt (server/tenancy.py).
    cache_salt: CacheSalt | None = None
    response_format: ResponseFormat | None = None
    # vLLM's structured-output extras (guided_grammar: Lark, or GBNF/EBNF, which is converted).
    # Never empty: a grammar that allows only the empty output cannot be run (onnxruntime-genai
    # refuses empty guidance data, and stops a generation at once and then asks for its mask).
    guided_json: dict[str, Any] | str | None = None
    guided_regex: NonEmptyStr | None = None
    guided_choice: Annotated[list[NonEmptyStr], Field(min_length=1)] | None = None
    guided_grammar: NonEmptyStr | None = None
    # Penalties: OpenAI's ranges; repetition_penalty is vLLM's extension (> 0, 1 = off). Each
    # engine honours some (LLMEngine.sampling_options); the others are refused when set.
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # > 0 and a finite float32, as the engines take it (1e-300 would be 0 there, 1e300 inf).
    repetition_penalty: StrictFloat | None = Field(
        default=None, ge=FLOAT32_TINY, le=FLOAT32_MAX, allow_inf_nan=False
    )
    # Token id (as a string, OpenAI's JSON) -> bias in [-100, 100], added to its logit.
    logit_bias: dict[str, Annotated[StrictFloat, Field(ge=-100.0, le=100.0)]] | None = None
    # vLLM's (and llama-server's) sampling extensions, vLLM's semantics (SamplingSettings).
    top_k: StrictInt | None = Field(default=None, ge=-1)  # -1 or 0: every token (vLLM's)
    min_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)
    min_tokens: StrictInt = Field(default=0, ge=0)
    ignore_eos: StrictBool = False
    stop_token_ids: (
        Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(max_length=MAX_STOP)] | None
    ) = None
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        strings = [stop] if isinstance(stop, str) else stop or []
        if len(strings) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings; got {len(strings)}")
        for index, text in enumerate(strings):
            if not 1 <= len(text) <= MAX_STOP_CHARS:
                raise ValueError(
                    f"stop string {index} has {len(text)} characters; "
                    f"each has 1 to {MAX_STOP_CHARS}"
                )
        return stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        options = self.stream_options
        return bool(options and options.include_usage and options.continuous_usage_stats)

    def check_supported(self) -> None:
        """InvalidSampling naming the first parameter Ferry would otherwise have to ignore."""
        if self.stream and self._streams_no_logprobs():
            raise InvalidSampling("logprobs", "logprobs with stream=true is not supported")

    def _streams_no_logprobs(self) -> bool:
        return False

    def _settings(
        self, max_tokens: int, logprobs: int | None = None, echo: bool = False
    ) -> SamplingSettings:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingSettings(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop,
            logprobs=logprobs,
            echo=echo,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=self._logit_bias(),
            top_k=max(self.top_k or 0, 0),
            min_p=self.min_p or 0.0,
            min_tokens=self._min_tokens(max_tokens),
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
        )

    def _min_tokens(self, max_tokens: int) -> int:
        if self.min_tokens > max_tokens:  # vLLM's rule: a request that cannot be met
            message = f"min_tokens ({self.min_tokens}) is more than max_tokens ({max_tokens})"
            raise InvalidSampling("min_tokens", message)
        return self.min_tokens

    def _logit_bias(self) -> tuple[tuple[int, float], ...]:
        biases = []
        for key, bias in (self.logit_bias or {}).items():
            if not key.isdecimal():  # OpenAI's keys are token ids; a word is another tokenizer's
                raise InvalidSampling("logit_bias", f"logit_bias key {key!r} is not a token id")
            biases.append((int(key), bias))
        return tuple(sorted(biases))


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessageParam] = Field(min_length=1)
    model: str
    max_tokens: StrictInt | None = Field(default=None, ge=1)  # deprecated by OpenAI, still common
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None

    def chat_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)

    def check_supported(self) -> None:
        super().check_supported()
        for i, message in enumerate(self.messages):
            for j, call in enumerate(message.tool_calls or ()):
                field = f"messages[{i}].tool_calls[{j}].function.arguments"
                check_json_depth(call.function.arguments, field)

    def to_sampling(self, default_max_tokens: int) -> SamplingSettings:
        """Engine settings; without a limit, generate up to the room left in the context."""
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidSampling("top_logprobs", "top_logprobs needs logprobs=true")
        limit = self.max_completion_tokens or self.max_tokens or default_max_tokens
        return self._settings(limit, (self.top_logprobs or 0) if self.logprobs else None)


class CompletionRequest(_SamplingFields):
    model: str
    # Text, texts, one prompt as token ids, or several (as lm-eval sends by default).
    prompt: (
        Prompt
        | Annotated[list[Prompt], Field(min_length=1)]
        | Annotated[list[StrictInt], Field(min_length=1)]
        | Annotated[list[Annotated[list[StrictInt], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: StrictInt = Field(default=16, ge=1)  # OpenAI's legacy default
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool = False

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: its text, or its token ids."""
        prompt = self.prompt
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)

    def _streams_no_logprobs(self) -> bool:
        # Chat streams carry logprobs per chunk; streamed completions do not (yet).
        return self.logprobs is not None or self.echo

    def to_sampling(self, default_max_tokens: int | None = None) -> SamplingSettings:
        # Echo without logprobs needs only the prompt's text, which serving adds itself.
        return self._settings(
            self.max_tokens, self.logprobs, self.echo and self.logprobs is not None
        )


# -- responses --------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens the engine reused from an earlier request


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # As OpenAI reports prompt caching; only when the engine says how many it reused.
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(
        cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> UsageInfo:
        details = None
        if cached_tokens is not None:
            details = PromptTokensDetails(cached_tokens=cached_tokens)
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=details,
        )


FinishReasonField = Literal["stop", "length", "abort", "tool_calls"] | None


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class CompletionLogprobs(BaseModel):
    """The legacy completions shape (lm-eval reads it): parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReasonField


class _ResponseHead(BaseModel):
    """The fields every response and chunk opens with, in OpenAI's order; each class narrows
    `object` (and gives `id` its prefix), then adds `choices` and `usage`."""

    id: str
    object: str
    created: int = Field(default_factory=_now)
    model: str


class ChatCompletionResponse(_ResponseHead):
    id: str = Field(default_factory=lambda: new_chat_id())
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReasonField = None


class ChatCompletionChunk(_ResponseHead):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None  # only on the last chunk, when stream_options.include_usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReasonField


class CompletionResponse(_ResponseHead):
    id: str = Field(default_factory=lambda: new_completion_id())
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReasonField = None


class CompletionChunk(_ResponseHead):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionStreamChoice]
    usage: UsageInfo | None = None


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
            choice["delta"] = _without_nulls(choice["delta"])
    return body


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
