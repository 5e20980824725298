"""OpenAI chat/completions serving logic over LLMEngines: no HTTP, no app wiring.

One straight path: a request is planned once (planning.py: prompt rendered and tokenized,
sampling validated and max_tokens fitted to the context), the engine gets token ids, and its
deltas go straight into chunks (stream) or results (JSON). Only n > 1 needs a task per choice,
to interleave them (streams.py).

Streaming methods wait for the first generated delta *before* returning, so overload, a dead
engine or a too-long prompt still become a proper HTTP error; errors after that are sent
in-stream as a `data:` error event (same error table as HTTP answers) followed by `[DONE]`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from ferry.llm.base import FinishReason, GenerationDelta, TokenLogprob
from ferry.llm.errors import EngineOverloaded
from ferry.server import tracing
from ferry.server.openai.admission import Admission, AdmitsGroups, Admitted
from ferry.server.openai.chunks import StreamChunks, chat_chunks, completion_chunks
from ferry.server.openai.grammars import Grammars
from ferry.server.openai.logprobs import chat_logprobs, completion_logprobs
from ferry.server.openai.observer import GenerationObserver, LLMObserver, NullObserver
from ferry.server.openai.planning import Choice, Plan, plan_chat, plan_completion
from ferry.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    FinishReasonField,
    UsageInfo,
)
from ferry.server.openai.streams import Deltas, merge, sse_events
from ferry.server.openai.tool_models import FunctionCall, ToolCall
from ferry.server.openai.tool_stream import ToolChunks, read_calls
from ferry.server.registry import ModelRegistry, ServedLLM
from ferry.server.tenancy import RunAs

if TYPE_CHECKING:
    from ferry.server.otel_tracing import GenerationSpan


@dataclass
class _Result:
    text: str = ""
    finish_reason: FinishReason | None = None
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()
    cached_tokens: int | None = None  # prompt tokens the engine reused (first delta)


class OpenAIServing:
    def __init__(
        self,
        models: ModelRegistry,
        *,
        observer: LLMObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        grammars: Grammars | None = None,
    ) -> None:
        self._models = models
        self.grammars = grammars or Grammars()
        self._observer: LLMObserver = observer or NullObserver()
        self._clock = clock
        # A request is admitted whole or refused whole (admission.py), so its own generations
        # never crowd it out mid-way.
        self._admission = Admission()

    def resolve(self, model: str) -> ServedLLM:
        """The one lookup of a request's model (UnknownModel); routes pass it on."""
        return self._models.llm(model)

    # -- endpoints --------------------------------------------------------------------------------

    async def chat(
        self,
        request: ChatCompletionRequest,
        served: ServedLLM | None = None,
        run_as: RunAs | None = None,
    ) -> ChatCompletionResponse:
        plan = await plan_chat(
            request, served or self.resolve(request.model), self.grammars, run_as
        )
        results = await self._collect(plan)
        decode = plan.served.engine.tokenizer.decode
        choices = [
            ChatCompletionResponseChoice(
                index=i,
                message=message,
                logprobs=chat_logprobs(r.logprobs, decode) if request.logprobs else None,
                finish_reason=finish_reason,
            )
            for i, r in enumerate(results)
            for message, finish_reason in [_chat_message(plan, r)]
        ]
        usage = _usage(plan, results)
        return ChatCompletionResponse(
            id=plan.response_id, model=plan.served.name, choices=choices, usage=usage
        )

    async def chat_stream(
        self,
        request: ChatCompletionRequest,
        served: ServedLLM | None = None,
        run_as: RunAs | None = None,
    ) -> AsyncIterator[str]:
        plan = await plan_chat(
            request, served or self.resolve(request.model), self.grammars, run_as
        )
        decode = plan.served.engine.tokenizer.decode
        logprobs = (lambda d: chat_logprobs(d.logprobs, decode)) if request.logprobs else None
        chunks = chat_chunks(plan.response_id, plan.served.name, request.n, logprobs)
        if plan.tools is not None:
            chunks = ToolChunks(chunks, request.n, plan.tools.text_allowed)  # type: ignore[assignment]  # duck-types StreamChunks
        return await self._stream(plan, chunks, request.include_usage, request.continuous_usage)

    async def completion(
        self,
        request: CompletionRequest,
        served: ServedLLM | None = None,
        run_as: RunAs | None = None,
    ) -> CompletionResponse:
        plan = await plan_completion(
            request, served or self.resolve(request.model), self.grammars, run_as
        )
        results = await self._collect(plan)

        def render() -> list[CompletionChoice]:
            return [
                _completion_choice(request, plan, choice, result)
                for choice, result in zip(plan.choices, results, strict=True)
            ]

        # Log probabilities are a decoded string per token and alternative: off the loop.
        logprobs = request.logprobs is not None
        choices = await asyncio.to_thread(render) if logprobs else render()
        usage = _usage(plan, results)
        return CompletionResponse(
            id=plan.response_id, model=plan.served.name, choices=choices, usage=usage
        )

    async def completion_stream(
        self,
        request: CompletionRequest,
        served: ServedLLM | None = None,
        run_as: RunAs | None = None,
    ) -> AsyncIterator[str]:
        plan = await plan_completion(
            request, served or self.resolve(request.model), self.grammars, run_as
        )
        chunks = completion_chunks(plan.response_id, plan.served.name)
        return await self._stream(plan, chunks, request.include_usage, request.continuous_usage)

    # -- running ----------------------------------------------------------------------------------

    def generations(self, plan: Plan) -> Deltas:
        """A planned request's deltas, for renderers other than chat's (the Responses API)."""
        return self._generations(plan)

    def _generations(self, plan: Plan) -> Deltas:
        """Every choice's deltas tagged with its index; closing this aborts what still runs.
        All of the plan's generations are admitted at once, or none (EngineOverloaded)."""
        observer: GenerationObserver = self._observer.for_model(plan.served.name)
        first = plan.choices[0]
        span = tracing.generation(
            observer, plan.served.name, plan.response_id, first.sampling, len(plan.choices)
        )
        if span is None:  # untraced: no layer between the engine and the renderer
            return self._run_generations(plan, observer)
        return self._traced_generations(plan, span)

    async def _traced_generations(self, plan: Plan, span: GenerationSpan) -> Deltas:
        """`_run_generations`, inside the request's generation span (GenAI attributes)."""
        failed: BaseException | None = None
        try:
            async with aclosing(self._run_generations(plan, span)) as deltas:
                async for item in deltas:
                    yield item
        except BaseException as exc:
            failed = exc
            raise
        finally:
            span.end(failed)

    async def _run_generations(self, plan: Plan, observer: GenerationObserver) -> Deltas:
        admitted = await self._admit(plan, observer)
        if plan.structured is not None:
            observer.structured(plan.structured)
        try:
            if len(plan.choices) == 1:
                generations = self._generate(plan, plan.choices[0], observer, admitted)
            else:
                generations = merge(
                    [self._generate(plan, c, observer, admitted) for c in plan.choices]
                )
            async with aclosing(generations) as deltas:
                async for item in deltas:
                    yield item
        finally:
            admitted.release()

    async def _admit(self, plan: Plan, observer: GenerationObserver) -> Admitted:
        engine, needed = plan.served.engine, len(plan.choices)
        try:
            if isinstance(engine, AdmitsGroups):  # another process's engine, shared
                return await engine.admit(needed)
            return self._admission.admit(engine, needed)
        except Exception as exc:
            reason = "rejected" if isinstance(exc, EngineOverloaded) else "error"
            for choice in plan.choices:  # ended before it ran
                observer.finished(reason, len(choice.prompt_ids), 0, 0.0)
            raise

    async def _generate(
        self, plan: Plan, choice: Choice, observer: GenerationObserver, admitted: Admitted
    ) -> Deltas:
        """One engine generation, timed for the observer as it passes."""
        clock, served = self._clock, plan.served
        started = last = clock()
        guided = choice.sampling.guidance is not None
        first_seen = False
        completion_tokens, reason = 0, "abort"
        request_id = f"{plan.response_id}-{choice.index}"
        try:
            # Engines' generate is an async generator (closable), typed as an iterator.
            generation = cast(
                AsyncGenerator[GenerationDelta, None],
                admitted.generate(
                    request_id,
                    choice.prompt_ids,
                    choice.sampling,
                    adapter=served.adapter,
                    priority=plan.priority,
                    cache_salt=plan.cache_salt,
                ),
            )
            async with aclosing(generation) as deltas:
                async for delta in deltas:
                    if delta.token_count:
                        now = clock()
                        tokens = delta.token_count
                        if not first_seen:
                            observer.first_token(now - started)
                            first_seen, tokens = True, tokens - 1
                        gap = (now - last) / delta.token_count
                        for _ in range(tokens):  # several tokens in one delta share the gap
                            observer.token(gap)
                            if guided:
                                observer.guided_token(gap)
                        last = now
                        completion_tokens += delta.token_count
                    if delta.finish_reason is not None:
                        reason = delta.finish_reason
                    yield choice.index, delta
        except EngineOverloaded:
            # Shed before it ran (429): a refusal, not a generation that failed.
            reason = "rejected"
            raise
        except Exception:
            reason = "error"
            raise
        finally:
            prompt_tokens = len(choice.prompt_ids)
            observer.finished(reason, prompt_tokens, completion_tokens, clock() - started)

    async def _collect(self, plan: Plan) -> list[_Result]:
        results = [_Result() for _ in plan.choices]
        async with aclosing(self._generations(plan)) as deltas:
            async for index, delta in deltas:
                result = results[index]
                result.text += delta.text
                result.completion_tokens += delta.token_count
                result.finish_reason = delta.finish_reason or result.finish_reason
                result.logprobs += delta.logprobs
                result.prompt_logprobs = delta.prompt_logprobs or result.prompt_logprobs
                if delta.cached_tokens is not None:
                    result.cached_tokens = delta.cached_tokens
        return results

    async def _stream(
        self, plan: Plan, chunks: StreamChunks, include_usage: bool, continuous: bool = False
    ) -> AsyncIterator[str]:
        """Start every generation and wait for the first delta, so early errors raise here."""
        deltas = self._generations(plan)
        try:
            first = await anext(deltas)
        except BaseException:
            await deltas.aclose()
            raise
        usage_prompt_tokens = plan.prompt_tokens if include_usage else None
        return sse_events(
            deltas,
            first,
            chunks,
            usage_prompt_tokens,
            lambda cached: cached_tokens(plan, cached),
            continuous,
        )


def _completion_choice(
    request: CompletionRequest, plan: Plan, choice: Choice, result: _Result
) -> CompletionChoice:
    """The choice's text (after its prompt with `echo`) and, when asked, its log probabilities."""
    prefix = choice.prompt_text if request.echo else ""
    logprobs = None
    if request.logprobs is not None:
        generated = [e.token_id for e in result.logprobs]
        ids, entries = generated, list(result.logprobs)
        if request.echo:
            ids = choice.prompt_ids + generated
            entries = [*(result.prompt_logprobs or [None] * len(choice.prompt_ids)), *entries]
        decode = plan.served.engine.tokenizer.decode
        logprobs = completion_logprobs(ids, entries, decode, 0 if request.echo else len(prefix))
    return CompletionChoice(
        index=choice.index,
        text=prefix + result.text,
        logprobs=logprobs,
        finish_reason=result.finish_reason,
    )


def _chat_message(plan: Plan, result: _Result) -> tuple[ChatMessage, FinishReasonField]:
    """The answer as text, or as the tool calls it holds (finish_reason `tool_calls`, or
    `length` for a call cut short: read as its stream reads it, tool_stream.py)."""
    if plan.tools is None:
        return ChatMessage(content=result.text), result.finish_reason
    content, calls = read_calls([result.text], plan.tools.text_allowed)
    if not calls:  # text, or a call cut inside its name: no markup as content
        return ChatMessage(content=content or None), result.finish_reason
    tool_calls = [ToolCall(function=FunctionCall(name=n, arguments=a)) for n, a in calls]
    reason: FinishReasonField = (
        "tool_calls" if result.finish_reason == "stop" else result.finish_reason
    )
    return ChatMessage(content=None, tool_calls=tool_calls), reason


def _usage(plan: Plan, results: list[_Result]) -> UsageInfo:
    cached = {i: r.cached_tokens for i, r in enumerate(results) if r.cached_tokens is not None}
    completion_tokens = sum(r.completion_tokens for r in results)
    return UsageInfo.of(plan.prompt_tokens, completion_tokens, cached_tokens(plan, cached))


def cached_tokens(plan: Plan, by_choice: dict[int, int]) -> int | None:
    """usage.prompt_tokens_details.cached_tokens: like prompt_tokens, each distinct prompt once
    (its `n` choices share it; the most any of them reused); None when no engine reported."""
    if not by_choice:
        return None
    per_prompt: dict[int, int] = {}  # the n choices of one prompt share its list object
    for choice in plan.choices:
        if choice.index in by_choice:
            key = id(choice.prompt_ids)
            per_prompt[key] = max(per_prompt.get(key, 0), by_choice[choice.index])
    return sum(per_prompt.values())
