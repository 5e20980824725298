"""OpenAI requests checked once, before an engine sees them (the model already resolved by the
registry): grammars checked off the event loop (`grammars.py`), the prompt rendered and
tokenized, sampling validated and max_tokens fitted to each prompt's room."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from ferry.llm.base import LLMEngine, SamplingSettings
from ferry.llm.errors import InvalidPrompt, InvalidSampling, PromptTooLong
from ferry.server import tracing
from ferry.server.openai.grammars import Grammars
from ferry.server.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    new_chat_id,
    new_completion_id,
)
from ferry.server.openai.structured import output_guidance, request_kind
from ferry.server.openai.tools import ToolPlan, checked_tools, plan_tools, render_messages
from ferry.server.registry import ServedLLM
from ferry.server.tenancy import RunAs


@dataclass(frozen=True)
class Choice:
    """One generation: choice `index` of the response."""

    index: int
    prompt_ids: list[int]
    sampling: SamplingSettings  # max_tokens fitted to this prompt's room in the context
    prompt_text: str = ""  # for `echo`


@dataclass(frozen=True)
class Plan:
    """A checked request, ready to run."""

    served: ServedLLM  # resolved from the request's model: its name is a configured one
    response_id: str
    choices: list[Choice]
    prompt_tokens: int  # each distinct prompt once, however many choices it has (as OpenAI bills)
    priority: int = 0  # vLLM's meaning: lower is admitted first
    cache_salt: str | None = None  # prefix reuse only with this salt (server/tenancy.py)
    tools: ToolPlan | None = None  # the answer may hold tool calls
    structured: str | None = None  # the output constraint's kind, for the metrics


async def plan_chat(
    request: ChatCompletionRequest,
    served: ServedLLM,
    grammars: Grammars,
    run_as: RunAs | None = None,
) -> Plan:
    """`run_as`: the tenant's priority and salt (server/tenancy.py); None: the request's own."""
    request.check_supported()
    _check_capacity(served.engine, 1, request.n)
    # Grammars are checked (and refused) before the prompt is rendered: a 400, never a failure
    # inside the engine.
    output = output_guidance(request)
    answer = None  # what text chosen instead of a call follows: the response_format
    if output is not None and request.tools and request.tool_choice != "none":
        if output[1] != "response_format":  # vLLM's extras are not OpenAI's, nor combined
            raise InvalidSampling(output[1], f"{output[1]} cannot be combined with tools")
        answer = output[0]
    tools = plan_tools(request, answer)
    if tools is not None and request.logprobs and request.stream:
        raise InvalidSampling("logprobs", "logprobs with tools and stream=true is not supported")
    if tools is not None:
        tools = await checked_tools(tools, grammars, served.base)
    guidance = tools.guidance if tools is not None else None
    if output is not None and tools is None:  # with tools, the format is inside their grammar
        guidance = await grammars.check(output[0], served.base)
    tokenizer = served.engine.tokenizer
    native = getattr(tokenizer, "has_tool_format", False)
    messages = render_messages(request.chat_messages(), tools, native)
    template_tools = [tools.tools] if native and tools is not None else []
    with tracing.span("ferry.tokenize"):
        prompt_ids = await _encode_chat(tokenizer, served, messages, template_tools)
    sampling = request.to_sampling(served.engine.max_context_tokens)
    if guidance is not None:
        sampling = replace(sampling, guidance=guidance)
    plan = _plan(served, new_chat_id(), [prompt_ids], request.n, sampling, "messages")
    structured = request_kind(request, tools is not None)
    plan = replace(plan, tools=tools, structured=structured)
    return _running_as(plan, run_as or RunAs(request.priority, request.cache_salt))


async def plan_completion(
    request: CompletionRequest,
    served: ServedLLM,
    grammars: Grammars,
    run_as: RunAs | None = None,
) -> Plan:
    request.check_supported()
    output = output_guidance(request)  # checked (and refused) before any prompt is tokenized
    guidance = None if output is None else await grammars.check(output[0], served.base)
    engine = served.engine
    given = request.prompts()
    _check_capacity(engine, len(given), request.n)
    tokenizer = engine.tokenizer
    many = len(given) > 1
    prompts, texts = [], []
    for i, prompt in enumerate(given):
        if isinstance(prompt, str):
            prompts.append(tokenizer.encode(prompt))
            texts.append(prompt)
        else:
            prompts.append(_checked_ids(prompt, tokenizer.vocab_size, i if many else None))
            texts.append(tokenizer.decode(prompt) if request.echo else "")
    sampling = request.to_sampling(engine.max_context_tokens)
    if guidance is not None:
        sampling = replace(sampling, guidance=guidance)
    plan = _plan(served, new_completion_id(), prompts, request.n, sampling, "prompt")
    if request.echo and request.logprobs is not None:
        _check_echoed_logprobs(plan.choices, request.logprobs)
    structured = request_kind(request, tools=False)
    plan = replace(plan, structured=structured)
    plan = _running_as(plan, run_as or RunAs(request.priority, request.cache_salt))
    if request.echo:
        n = request.n
        choices = [replace(c, prompt_text=texts[c.index // n]) for c in plan.choices]
        plan = replace(plan, choices=choices)
    return plan


# Prompt tokens a request may echo with log probabilities, each counted once per alternative
# asked for and the token itself: every one is a vocabulary-wide softmax in the engine and a
# decoded string here (issue 48: 20 prompts of 2,000 tokens with logprobs 20 held the event
# loop 16 s and took 1.9 GB).
MAX_ECHOED_LOGPROBS = 65_536


def _check_echoed_logprobs(choices: list[Choice], logprobs: int) -> None:
    """`echo` with `logprobs`: refused before any work past MAX_ECHOED_LOGPROBS (400)."""
    tokens = sum(len(choice.prompt_ids) for choice in choices)
    entries = tokens * (logprobs + 1)
    if entries > MAX_ECHOED_LOGPROBS:
        raise InvalidSampling(
            "logprobs",
            f"echo with logprobs={logprobs} over {tokens} prompt tokens is {entries} log "
            f"probabilities; at most {MAX_ECHOED_LOGPROBS} per request (fewer prompts, shorter "
            "ones or a smaller logprobs)",
        )


def _running_as(plan: Plan, run_as: RunAs) -> Plan:
    return replace(plan, priority=run_as.priority, cache_salt=run_as.cache_salt)


def _plan(
    served: ServedLLM,
    response_id: str,
    prompts: list[list[int]],
    n: int,
    sampling: SamplingSettings,
    field: str,
) -> Plan:
    engine = served.engine
    _check_options(sampling, engine)
    choices = []
    for p, prompt_ids in enumerate(prompts):
        room = engine.max_context_tokens - len(prompt_ids)
        if room < 1:
            named = f"{field}[{p}]" if len(prompts) > 1 else field
            raise PromptTooLong(len(prompt_ids), engine.max_context_tokens, named)
        # Clamp instead of failing, the way a finished-by-length reply reads.
        fitted = sampling if sampling.max_tokens <= room else replace(sampling, max_tokens=room)
        choices += [Choice(p * n + j, prompt_ids, _seeded(fitted, j)) for j in range(n)]
    prompt_tokens = sum(len(ids) for ids in prompts)
    return Plan(served, response_id, choices, prompt_tokens)


def _seeded(sampling: SamplingSettings, choice: int) -> SamplingSettings:
    """Choice i of a prompt samples with seed + i, as vLLM's parallel sampling does, so that n
    seeded choices differ (each still reproducible); kept within int64, the API's range."""
    if sampling.seed is None or choice == 0:
        return sampling
    seed = (sampling.seed + choice + 2**63) % 2**64 - 2**63
    return replace(sampling, seed=seed)


async def _encode_chat(
    tokenizer: Any, served: ServedLLM, messages: list[dict[str, Any]], tools: list[Any]
) -> list[int]:
    """The chat prompt's ids. A prompt that cannot fit the context is refused before any
    rendering (its characters counted: tool arguments and descriptions, instructions, every
    part); a large one is rendered and tokenized off the event loop."""
    chars = _text_chars([messages, tools])
    longest = getattr(tokenizer, "longest_token_chars", None)
    context = served.engine.max_context_tokens
    if longest is not None and chars > context * longest:
        message = (
            f"messages: {chars} characters cannot fit this model's {context} tokens "
            f"(no token is longer than {longest} characters)"
        )
        raise InvalidPrompt("messages", message)
    if chars <= _INLINE_PROMPT_CHARS:
        return list(tokenizer.encode_chat(messages, *tools))
    return list(await asyncio.to_thread(tokenizer.encode_chat, messages, *tools))


# Rendered and tokenized on the event loop up to this size (well under a millisecond).
_INLINE_PROMPT_CHARS = 16_384


def _text_chars(value: Any) -> int:
    """The characters of every string inside `value` (dicts' keys too), and of every other
    value as written: a call's arguments reach a template parsed, and it writes them back as
    JSON, numbers and all."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + _text_chars(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_text_chars(v) for v in value)
    return 0 if value is None else len(str(value))


def _check_capacity(engine: LLMEngine, prompts: int, n: int) -> None:
    """A request needing more generations than the engine ever holds at once can never be
    served: a 400 before tokenizing, not a 429 that no retry could get past."""
    limit = engine.max_concurrent_generations
    if prompts * n <= limit:
        return
    param = "n" if n > 1 and prompts <= limit else "prompt"
    raise InvalidSampling(
        param,
        f"{prompts} prompt(s) x n={n} is {prompts * n} generations, but model "
        f"{engine.name} runs at most {limit} at once (running + waiting): "
        "send fewer prompts or a smaller n",
    )


def _checked_ids(ids: list[int], vocab_size: int, index: int | None) -> list[int]:
    """A prompt given as token ids must be this model's (docs/apis.md on foreign ids); the
    schema already refused an empty one."""
    param = "prompt" if index is None else f"prompt[{index}]"
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidPrompt(
            param, f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})"
        )
    return ids


def _check_options(sampling: SamplingSettings, engine: LLMEngine) -> None:
    """What this engine cannot honour is refused, never ignored; biased ids must be its own."""
    for name in sampling.requested_options():
        if name not in engine.sampling_options:
            message = f"{name} is not supported by the engine serving {engine.name}"
            raise InvalidSampling(name, message)
    vocab_size = engine.tokenizer.vocab_size
    for name, ids in (
        ("logit_bias", [t for t, _ in sampling.logit_bias]),
        ("stop_token_ids", sampling.stop_token_ids),
    ):
        bad = next((t for t in ids if t >= vocab_size), None)
        if bad is not None:
            message = f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})"
            raise InvalidSampling(name, message)
    if sampling.guidance is not None:
        # A grammar that is complete may allow only the end: banning it leaves no token at all.
        for name in ("ignore_eos", "min_tokens"):
            if getattr(sampling, name):
                message = f"{name} cannot be combined with structured output or tools"
                raise InvalidSampling(name, message)
