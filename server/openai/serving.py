"""OpenAI chat/completions serving logic over LLMEngines: no HTTP, no app wiring.

One straight path: a request is planned once (prompt rendered and tokenized, sampling validated
and max_tokens fitted to the context), the engine gets token ids, and its deltas go straight
into chunks (stream) or results (JSON). Only n > 1 needs a task per choice, to interleave them.

Streaming methods wait for the first generated delta *before* returning, so overload, a dead
engine or a too-long prompt still become a proper HTTP error; errors after that are sent
in-stream as a `data:` error event (same error table as HTTP answers) followed by `[DONE]`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from ferry.llm.base import (
    EngineStats,
    GenerationDelta,
    LLMEngine,
    SamplingSettings,
    TokenLogprob,
)
from ferry.llm.errors import (
    EngineOverloaded,
    InvalidAdapter,
    InvalidSampling,
    ModelNotFound,
    PromptTooLong,
)
from ferry.server.errors import error_payload
from ferry.server.openai.chunks import StreamChunks, chat_chunks, completion_chunks
from ferry.server.openai.logprobs import chat_logprobs, completion_logprobs
from ferry.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    new_chat_id,
    new_completion_id,
)
from ferry.server.openai.sse import DONE, sse_data


class LLMObserver(Protocol):
    """Hooks for LLM metrics; server/metrics.py implements them with ferry_llm_* series."""

    def on_first_token(self, model: str, seconds: float) -> None: ...

    def on_token(self, model: str, seconds_since_last: float) -> None: ...

    def on_finished(
        self,
        model: str,
        finish_reason: str,  # stop | length | abort (client left) | rejected (429) | error
        prompt_tokens: int,
        completion_tokens: int,
        seconds: float,
    ) -> None: ...


class NullObserver:
    def on_first_token(self, model: str, seconds: float) -> None:
        pass

    def on_token(self, model: str, seconds_since_last: float) -> None:
        pass

    def on_finished(
        self,
        model: str,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        seconds: float,
    ) -> None:
        pass


@dataclass(frozen=True)
class ServedModel:
    """A name requests can ask for: a base model, or a LoRA adapter on one."""

    name: str
    engine: LLMEngine
    base: str  # the engine's configured name
    adapter: str | None = None

    @property
    def parent(self) -> str | None:
        return self.base if self.adapter is not None else None


@dataclass(frozen=True)
class _Choice:
    """One generation: choice `index` of the response."""

    index: int
    prompt_ids: list[int]
    sampling: SamplingSettings  # max_tokens fitted to this prompt's room in the context
    prompt_text: str = ""  # for `echo`


@dataclass(frozen=True)
class _Plan:
    """A checked request, ready to run."""

    served: ServedModel  # resolved from the request's model: its name is a configured one
    response_id: str
    choices: list[_Choice]
    prompt_tokens: int  # each distinct prompt once, however many choices it has (as OpenAI bills)


@dataclass
class _Result:
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()


_Deltas = AsyncIterator[tuple[int, GenerationDelta]]


class OpenAIServing:
    def __init__(
        self,
        engines: Mapping[str, LLMEngine],
        *,
        observer: LLMObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engines = dict(engines)
        self._observer: LLMObserver = observer or NullObserver()
        self._clock = clock
        self._unloads: set[asyncio.Task[None]] = set()

    def served_models(self) -> list[ServedModel]:
        """Every base model and every loaded adapter, by name."""
        served = [ServedModel(name, engine, name) for name, engine in self._engines.items()]
        for base, engine in self._engines.items():
            served += [ServedModel(a, engine, base, a) for a in engine.adapter_names()]
        return sorted(served, key=lambda m: m.name)

    def model_names(self) -> list[str]:
        return [m.name for m in self.served_models()]

    def engine_stats(self) -> dict[str, EngineStats]:
        """Per-engine running/waiting counts (adapters included), for the metrics gauges."""
        return {name: engine.stats() for name, engine in self._engines.items()}

    def resolve(self, model: str) -> ServedModel:
        engine = self._engines.get(model)
        if engine is not None:
            return ServedModel(model, engine, model)
        for base, engine in self._engines.items():
            if model in engine.adapter_names():
                return ServedModel(model, engine, base, model)
        raise ModelNotFound(model)

    def engine_for(self, model: str) -> LLMEngine:
        return self.resolve(model).engine

    # -- adapters ---------------------------------------------------------------------------------

    async def load_adapter(self, name: str, path: Path, base: str) -> None:
        if name in self.model_names():
            raise InvalidAdapter("lora_name", f"The model `{name}` is already served.")
        engine = self._engines.get(base)
        if engine is None:
            raise ModelNotFound(base)
        await engine.load_adapter(name, path)

    async def unload_adapter(self, name: str) -> None:
        """Returns once the requests on `name` finished and it is freed; new ones fail now.
        The unload itself runs on even if the caller goes away, so nothing is left half-done."""
        served = self.resolve(name)
        if served.adapter is None:
            raise InvalidAdapter("lora_name", f"`{name}` is a base model, not a LoRA adapter.")
        task = asyncio.create_task(served.engine.unload_adapter(name))
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)
        await asyncio.shield(task)

    # -- endpoints --------------------------------------------------------------------------------

    async def chat(self, request: ChatCompletionRequest) -> ChatCompletionResponse:
        plan = self._plan_chat(request)
        results = await self._collect(plan)
        decode = plan.served.engine.tokenizer.decode
        choices = [
            ChatCompletionResponseChoice(
                index=i,
                message=ChatMessage(content=r.text),
                logprobs=chat_logprobs(r.logprobs, decode) if request.logprobs else None,
                finish_reason=r.finish_reason,
            )
            for i, r in enumerate(results)
        ]
        return ChatCompletionResponse(
            id=plan.response_id,
            model=plan.served.name,
            choices=choices,
            usage=_usage(plan, results),
        )

    async def chat_stream(self, request: ChatCompletionRequest) -> AsyncIterator[str]:
        plan = self._plan_chat(request)
        decode = plan.served.engine.tokenizer.decode
        logprobs = (lambda d: chat_logprobs(d.logprobs, decode)) if request.logprobs else None
        chunks = chat_chunks(plan.response_id, plan.served.name, request.n, logprobs)
        return await self._stream(plan, chunks, request.include_usage)

    async def completion(self, request: CompletionRequest) -> CompletionResponse:
        plan = self._plan_completion(request)
        results = await self._collect(plan)
        choices = [
            _completion_choice(request, plan, choice, result)
            for choice, result in zip(plan.choices, results, strict=True)
        ]
        return CompletionResponse(
            id=plan.response_id,
            model=plan.served.name,
            choices=choices,
            usage=_usage(plan, results),
        )

    async def completion_stream(self, request: CompletionRequest) -> AsyncIterator[str]:
        plan = self._plan_completion(request)
        chunks = completion_chunks(plan.response_id, plan.served.name)
        return await self._stream(plan, chunks, request.include_usage)

    # -- planning: everything checked once, before the engine sees the request -----------------

    def _plan_chat(self, request: ChatCompletionRequest) -> _Plan:
        request.check_supported()
        served = self.resolve(request.model)
        tokenizer = served.engine.tokenizer
        prompt_ids = tokenizer.encode_chat(request.chat_messages())
        sampling = request.to_sampling(served.engine.max_context_tokens)
        return self._plan(served, new_chat_id(), [prompt_ids], request.n, sampling)

    def _plan_completion(self, request: CompletionRequest) -> _Plan:
        request.check_supported()
        served = self.resolve(request.model)
        engine = served.engine
        tokenizer = engine.tokenizer
        many = len(request.prompts()) > 1
        prompts, texts = [], []
        for i, prompt in enumerate(request.prompts()):
            if isinstance(prompt, str):
                prompts.append(tokenizer.encode(prompt))
                texts.append(prompt)
            else:
                prompts.append(_checked_ids(prompt, tokenizer.vocab_size, i if many else None))
                texts.append(tokenizer.decode(prompt) if request.echo else "")
        sampling = request.to_sampling(engine.max_context_tokens)
        plan = self._plan(served, new_completion_id(), prompts, request.n, sampling)
        if request.echo:
            n = request.n
            choices = [replace(c, prompt_text=texts[c.index // n]) for c in plan.choices]
            plan = replace(plan, choices=choices)
        return plan

    @staticmethod
    def _plan(
        served: ServedModel,
        response_id: str,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingSettings,
    ) -> _Plan:
        sampling.validate()
        engine = served.engine
        choices = []
        for p, prompt_ids in enumerate(prompts):
            room = engine.max_context_tokens - len(prompt_ids)
            if room < 1:
                raise PromptTooLong(len(prompt_ids), engine.max_context_tokens)
            # Clamp instead of failing, the way a finished-by-length reply reads.
            fitted = sampling if sampling.max_tokens <= room else replace(sampling, max_tokens=room)
            choices += [_Choice(p * n + j, prompt_ids, fitted) for j in range(n)]
        prompt_tokens = sum(len(ids) for ids in prompts)
        return _Plan(served, response_id, choices, prompt_tokens)

    # -- running ----------------------------------------------------------------------------------

    def _generations(self, plan: _Plan) -> _Deltas:
        """Every choice's deltas tagged with its index; closing this aborts what still runs."""
        if len(plan.choices) == 1:
            return self._generate(plan, plan.choices[0])
        return _merge([self._generate(plan, choice) for choice in plan.choices])

    async def _generate(self, plan: _Plan, choice: _Choice) -> _Deltas:
        """One engine generation, timed for the observer as it passes."""
        observer, clock, served = self._observer, self._clock, plan.served
        model = served.name
        started = last = clock()
        first_seen = False
        completion_tokens, reason = 0, "abort"
        request_id = f"{plan.response_id}-{choice.index}"
        try:
            generation = served.engine.generate(
                request_id, choice.prompt_ids, choice.sampling, adapter=served.adapter
            )
            async with aclosing(generation) as deltas:
                async for delta in deltas:
                    if delta.token_count:
                        now = clock()
                        tokens = delta.token_count
                        if not first_seen:
                            observer.on_first_token(model, now - started)
                            first_seen, tokens = True, tokens - 1
                        for _ in range(tokens):  # several tokens in one delta share the gap
                            observer.on_token(model, (now - last) / delta.token_count)
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
            observer.on_finished(model, reason, prompt_tokens, completion_tokens, clock() - started)

    async def _collect(self, plan: _Plan) -> list[_Result]:
        results = [_Result() for _ in plan.choices]
        async with aclosing(self._generations(plan)) as deltas:
            async for index, delta in deltas:
                result = results[index]
                result.text += delta.text
                result.completion_tokens += delta.token_count
                result.finish_reason = delta.finish_reason or result.finish_reason
                result.logprobs += delta.logprobs
                result.prompt_logprobs = delta.prompt_logprobs or result.prompt_logprobs
        return results

    async def _stream(
        self, plan: _Plan, chunks: StreamChunks, include_usage: bool
    ) -> AsyncIterator[str]:
        """Start every generation and wait for the first delta, so early errors raise here."""
        deltas = self._generations(plan)
        try:
            first = await anext(deltas)
        except BaseException:
            await deltas.aclose()
            raise
        usage_prompt_tokens = plan.prompt_tokens if include_usage else None
        return _events(deltas, first, chunks, usage_prompt_tokens)


async def _events(
    deltas: _Deltas,
    first: tuple[int, GenerationDelta],
    chunks: StreamChunks,
    usage_prompt_tokens: int | None,
) -> AsyncIterator[str]:
    """The SSE text of a started response: deltas, the usage if asked for, then [DONE]. An error
    after streaming began is one error event, since the HTTP status has already been sent."""
    index, delta = first
    completion_tokens = delta.token_count
    try:
        async with aclosing(deltas):
            yield chunks.opening + chunks.delta(index, delta)
            async for index, delta in deltas:
                completion_tokens += delta.token_count
                event = chunks.delta(index, delta)
                if event:
                    yield event
    except Exception as exc:
        yield sse_data(error_payload(exc)[1])
        yield DONE
        return
    if usage_prompt_tokens is not None:
        yield chunks.usage(usage_prompt_tokens, completion_tokens)
    yield DONE


def _checked_ids(ids: list[int], vocab_size: int, index: int | None) -> list[int]:
    """A prompt given as token ids must be this model's (see the README on foreign ids)."""
    param = "prompt" if index is None else f"prompt[{index}]"
    if not ids:
        raise InvalidSampling(param, "a prompt of token ids must not be empty")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidSampling(
            param, f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})"
        )
    return ids


def _completion_choice(
    request: CompletionRequest, plan: _Plan, choice: _Choice, result: _Result
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


def _usage(plan: _Plan, results: list[_Result]) -> UsageInfo:
    return UsageInfo.of(plan.prompt_tokens, sum(r.completion_tokens for r in results))


async def _merge(streams: list[_Deltas]) -> _Deltas:
    """Interleave several generations as they produce; closing this cancels (aborts) them all."""
    queue: asyncio.Queue[tuple[int, GenerationDelta] | Exception | None] = asyncio.Queue()

    async def pump(stream: _Deltas) -> None:
        try:
            async with aclosing(stream) as items:  # type: ignore[type-var]
                async for item in items:
                    queue.put_nowait(item)
            queue.put_nowait(None)
        except Exception as exc:
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
