"""The engine protocol the OpenAI serving layer talks to, and the plain types it passes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypedDict, Unpack

from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import EngineDead, EngineOverloaded

FinishReason = Literal["stop", "length", "abort"]
# A temperature or top_p below this samples the likeliest token every time: that is the limit of
# both, and a nucleus this small holds only the top token for any vocabulary under a million
# (its probability is at least 1/vocab). Such requests run greedy, as vLLM runs temperatures under
# its 1e-5: the engines take float32, where 5e-324 is 0 and refused.
SAMPLING_EPS = 1e-6
# The engines take float32: a penalty that rounds to 0 or overflows there is refused.
FLOAT32_TINY, FLOAT32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38

# The grammar kinds both engines take: onnxruntime-genai's `set_guidance` types (llguidance),
# which vLLM's structured outputs take as `json`, `regex` and `grammar`.
GuidanceKind = Literal["json_schema", "regex", "lark_grammar"]


@dataclass(frozen=True)
class Guidance:
    """A grammar the output must follow, compiled once by the serving layer and checked there."""

    kind: GuidanceKind
    data: str  # json_schema: the schema as JSON text; regex: the pattern; lark_grammar: the text
    param: str = "guidance"  # the request field it came from, for an engine's refusal


@dataclass(frozen=True)
class SamplingSettings:
    """Generation settings, in range by construction: the serving layer's request schema checks
    every range once (a 400 naming the field), and nothing below checks again."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # Log probabilities of the generated tokens with this many alternatives each; None: none.
    logprobs: int | None = None
    # The prompt's tokens with their log probabilities as well (completions' `echo`).
    echo: bool = False
    # Constrained decoding (response_format, guided_*, tools); None: free text.
    guidance: Guidance | None = None
    # Penalties and biases (vLLM's SamplingParams semantics). Each engine names the ones it
    # honours in `LLMEngine.sampling_options`; a request asking another one for them is a 400.
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in prompt or output
    presence_penalty: float = 0.0  # [-2, 2], subtracted once from a generated token's logit
    frequency_penalty: float = 0.0  # [-2, 2], subtracted per occurrence in the output
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    # vLLM's (and llama-server's) extensions, with vLLM's semantics; optional as the above.
    top_k: int = 0  # sample among the k likeliest tokens; 0: all
    min_p: float = 0.0  # drop tokens below min_p x the likeliest's probability
    min_tokens: int = 0  # no end of sequence (EOS, stop_token_ids) before this many tokens
    ignore_eos: bool = False  # the model's end of sequence is never chosen: max_tokens ends it
    stop_token_ids: tuple[int, ...] = ()  # end the generation as EOS does (not emitted)
    include_stop_str_in_output: bool = False  # a matched stop string ends the text
    skip_special_tokens: bool = True  # special tokens' text left out of the output

    @property
    def greedy(self) -> bool:
        """Always the likeliest token: temperature 0, or one or top_p too small to matter."""
        return self.temperature < SAMPLING_EPS or self.top_p < SAMPLING_EPS

    def requested_options(self) -> list[str]:
        """The optional fields (SAMPLING_OPTIONS) this request sets to something other than
        their neutral value: the engine must honour each."""
        return [name for name in SAMPLING_OPTIONS if getattr(self, name) != _NEUTRAL[name]]


# Sampling fields an engine may or may not honour (LLMEngine.sampling_options), neutral values.
_NEUTRAL: dict[str, object] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": (),
    "top_k": 0,
    "min_p": 0.0,
    "min_tokens": 0,
    "ignore_eos": False,
    "stop_token_ids": (),
    "include_stop_str_in_output": False,
    "skip_special_tokens": True,
}
SAMPLING_OPTIONS: tuple[str, ...] = tuple(_NEUTRAL)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's natural-log probability under the model, and the likeliest at its place."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), likeliest first


@dataclass(frozen=True)
class GenerationDelta:
    """What one engine step added to a generation."""

    text: str
    token_count: int  # tokens generated in this step, including ones held back by a stop match
    finish_reason: FinishReason | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, when sampling.logprobs is set
    # On the first delta when sampling.echo: one per prompt token (None for the first).
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    # On the first delta, from engines that know: prompt tokens whose computation was reused
    # from an earlier request (prefix cache), OpenAI's usage.prompt_tokens_details.cached_tokens.
    cached_tokens: int | None = None


def merge_deltas(first: GenerationDelta, second: GenerationDelta) -> GenerationDelta:
    """Two consecutive deltas of one generation as one."""
    return GenerationDelta(
        text=first.text + second.text,
        token_count=first.token_count + second.token_count,
        finish_reason=second.finish_reason,
        logprobs=first.logprobs + second.logprobs,
        prompt_logprobs=first.prompt_logprobs or second.prompt_logprobs,
        cached_tokens=second.cached_tokens if first.cached_tokens is None else first.cached_tokens,
    )


def check_admission(
    name: str, ready: bool, held: int, capacity: int, failure: BaseException | None = None
) -> None:
    """Refuse a generation before it starts, as every engine does: a stopped engine
    (EngineDead, from the `failure` that stopped it), or one already holding `capacity`
    generations (EngineOverloaded)."""
    if not ready:
        raise EngineDead(f"engine {name} is not running") from failure
    if held >= capacity:
        raise EngineOverloaded(f"engine {name} has {held} requests")


@dataclass(frozen=True)
class EngineStats:
    running: int  # requests inside the runtime
    waiting: int  # admitted, queued in front of the runtime
    # Prefix cache counters since start, in prompt tokens (vLLM's prefix_cache_queries/hits).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # The model-server protocol's KVCacheUtilization (0..1, vLLM's kv_cache_usage_perc): KV
    # positions running sequences hold over those the engine admits; None where unknown.
    kv_cache_usage: float | None = None
    # The protocol's LoRA info (vLLM's lora_requests_info labels): adapters loaded and ready,
    # and those that requests waiting in the engine name.
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    # Speculation's counters since start (vLLM's spec_decode_num_draft_tokens and
    # spec_decode_num_accepted_tokens): tokens drafted, and those the verify step kept.
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


class GenerateOptions(TypedDict, total=False):
    """generate()'s optional keywords, declared once for the protocol and every engine
    (`generate_options` gives each with its default).

    `adapter` names a loaded LoRA adapter (AdapterNotLoaded if it is not); None: the base.
    `priority` (vLLM's meaning, default 0): waiting requests with a lower number are admitted
    first. `cache_salt` (vLLM's meaning): the prompt reuses cached prefixes only of requests with
    the same salt, and `cached_tokens` counts only those (server/tenancy.py builds it)."""

    adapter: str | None
    priority: int
    cache_salt: str | None


def generate_options(options: GenerateOptions) -> tuple[str | None, int, str | None]:
    """(adapter, priority, cache_salt) of a generate() call, defaults where it gave none."""
    return options.get("adapter"), options.get("priority", 0), options.get("cache_salt")


class LLMEngine(Protocol):
    """Runs already-checked generations: the serving layer tokenizes the prompt, validates the
    settings and clamps max_tokens to the context once; engines trust what they are given."""

    name: str
    max_context_tokens: int
    tokenizer: ChatTokenizer  # the prompt side: chat template, encode, decode
    # The optional SamplingSettings fields (SAMPLING_OPTIONS) this engine honours; the serving
    # layer refuses a request setting any other.
    sampling_options: frozenset[str]

    @property
    def max_concurrent_generations(self) -> int:
        """How many generations it holds at once (running + waiting), read without starting
        any work (valid once started): more are refused with EngineOverloaded, so a request
        needing more can never be served."""
        ...

    def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingSettings,
        **options: Unpack[GenerateOptions],
    ) -> AsyncIterator[GenerationDelta]:
        """Stream deltas; the last one has a finish_reason. Closing the iterator early aborts."""
        ...

    def adapter_names(self) -> list[str]: ...

    async def load_adapter(self, name: str, path: Path) -> None:
        """Raise InvalidAdapter if the name is taken, the limit reached or the file bad."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """New requests on it fail at once; returns once the requests using it finished."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def is_ready(self) -> bool: ...

    def stats(self) -> EngineStats: ...
