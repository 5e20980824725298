"""OpenAI chat/completions serving logic over LLMEngines: no HTTP, no app wiring.

Routes parse a request, call `chat`/`completion` (JSON) or `chat_stream`/`completion_stream`
(SSE lines), and map the domain errors raised here (llm.errors) to status codes in one table.
Streaming methods validate and wait for the first generated delta *before* returning, so
overload, a dead engine or a too-long prompt still become a proper HTTP error; errors after
that are sent in-stream as a `data:` error event followed by `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

from ferry.llm.base import EngineStats, GenerationDelta, LLMEngine, SamplingSettings
from ferry.llm.errors import InvalidSampling, LLMError, ModelNotFound, PromptTooLong
from ferry.server.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionStreamChoice,
    ChatMessage,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamChoice,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    UsageInfo,
    dump_chunk,
    new_chat_id,
    new_completion_id,
)
from ferry.server.openai.sse import DONE, TextTemplate, sse_data


class LLMObserver(Protocol):
    """Hooks for LLM metrics; server/metrics.py implements them with ferry_llm_* series."""

    def on_first_token(self, model: str, seconds: float) -> None: ...

    def on_token(self, model: str, seconds_since_last: float) -> None: ...

    def on_finished(
        self,
        model: str,
        finish_reason: str,  # stop | length | abort (client left) | error
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


def default_error_info(exc: BaseException) -> ErrorInfo:
    """In-stream error payloads; the server may pass its own mapper to share its one table."""
    if isinstance(exc, InvalidSampling):
        return ErrorInfo(message=str(exc), type="BadRequestError", param=exc.field)
    if isinstance(exc, LLMError):
        return ErrorInfo(message=str(exc), type=type(exc).__name__)
    return ErrorInfo(message="internal error", type="InternalServerError")


@dataclass(frozen=True)
class _Job:
    """One generation: choice `index` of the response."""

    index: int
    prompt: str
    prompt_tokens: int


@dataclass(frozen=True)
class _Out:
    """One thing a stream relays: a delta of choice `index`, the usage, or a late error."""

    index: int = 0
    delta: GenerationDelta | None = None
    usage: UsageInfo | None = None
    error: ErrorResponse | None = None


@dataclass
class _Result:
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0


_Stream = AsyncIterator[tuple[int, GenerationDelta]]


class OpenAIServing:
    def __init__(
        self,
        engines: Mapping[str, LLMEngine],
        *,
        observer: LLMObserver | None = None,
        error_info: Callable[[BaseException], ErrorInfo] = default_error_info,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engines = dict(engines)
        self._observer: LLMObserver = observer or NullObserver()
        self._error_info = error_info
        self._clock = clock

    def model_names(self) -> list[str]:
        return sorted(self._engines)

    def engine_stats(self) -> dict[str, EngineStats]:
        """Per-model running/waiting counts, for the metrics gauges."""
        return {name: engine.stats() for name, engine in self._engines.items()}

    def engine_for(self, model: str) -> LLMEngine:
        try:
            return self._engines[model]
        except KeyError:
            raise ModelNotFound(model) from None

    # -- chat -------------------------------------------------------------------------------------

    async def chat(self, request: ChatCompletionRequest) -> ChatCompletionResponse:
        engine, jobs, sampling = self._plan_chat(request)
        response_id = new_chat_id()
        results = await self._collect(engine, request.model, response_id, jobs, sampling)
        choices = [
            ChatCompletionResponseChoice(
                index=i, message=ChatMessage(content=r.text), finish_reason=r.finish_reason
            )
            for i, r in enumerate(results)
        ]
        completion_tokens = sum(r.completion_tokens for r in results)
        usage = UsageInfo.of(jobs[0].prompt_tokens, completion_tokens)  # prompt counted once
        return ChatCompletionResponse(
            id=response_id, model=request.model, choices=choices, usage=usage
        )

    async def chat_stream(self, request: ChatCompletionRequest) -> AsyncIterator[str]:
        engine, jobs, sampling = self._plan_chat(request)
        response_id, created = new_chat_id(), int(time.time())
        stream, first = await self._start(engine, request.model, response_id, jobs, sampling)

        def chunk(
            index: int | None,
            delta: DeltaMessage | None = None,
            finish: str | None = None,
            usage: UsageInfo | None = None,
        ) -> str:
            choices = []
            if index is not None:
                choice = ChatCompletionStreamChoice(
                    index=index, delta=delta or DeltaMessage(), finish_reason=finish
                )
                choices.append(choice)
            body = ChatCompletionChunk(
                id=response_id, created=created, model=request.model, choices=choices, usage=usage
            )
            return sse_data(dump_chunk(body))

        templates: dict[int, TextTemplate] = {}

        def content(index: int, text: str) -> str:
            if index not in templates:
                body = chunk(index, DeltaMessage(content=TextTemplate.SENTINEL))
                templates[index] = TextTemplate(json.loads(body[len("data: ") :]))
            return templates[index].fill(text)

        async def events() -> AsyncIterator[str]:
            for job in jobs:  # OpenAI opens every choice with the role
                yield chunk(job.index, DeltaMessage(role="assistant", content=""))
            async for out in self._relay(stream, first, jobs[0].prompt_tokens, request):
                if out.delta is not None:
                    if out.delta.text:
                        yield content(out.index, out.delta.text)
                    if out.delta.finish_reason is not None:
                        yield chunk(out.index, finish=out.delta.finish_reason)
                elif out.usage is not None:
                    yield chunk(None, usage=out.usage)
                elif out.error is not None:
                    yield sse_data(out.error.model_dump())
            yield DONE

        return events()

    def _plan_chat(
        self, request: ChatCompletionRequest
    ) -> tuple[LLMEngine, list[_Job], SamplingSettings]:
        engine = self.engine_for(request.model)
        prompt = engine.render_chat(request.chat_messages())
        prompt_tokens = self._check_prompt(engine, prompt)
        sampling = request.to_sampling(engine.max_context_tokens - prompt_tokens)
        sampling.validate()
        jobs = [_Job(i, prompt, prompt_tokens) for i in range(request.n)]
        return engine, jobs, sampling

    # -- completions ------------------------------------------------------------------------------

    async def completion(self, request: CompletionRequest) -> CompletionResponse:
        engine, jobs, sampling = self._plan_completion(request)
        response_id = new_completion_id()
        results = await self._collect(engine, request.model, response_id, jobs, sampling)
        choices = [
            CompletionChoice(index=i, text=r.text, finish_reason=r.finish_reason)
            for i, r in enumerate(results)
        ]
        usage = UsageInfo.of(
            _prompt_tokens(jobs, request.n), sum(r.completion_tokens for r in results)
        )
        return CompletionResponse(id=response_id, model=request.model, choices=choices, usage=usage)

    async def completion_stream(self, request: CompletionRequest) -> AsyncIterator[str]:
        engine, jobs, sampling = self._plan_completion(request)
        response_id, created = new_completion_id(), int(time.time())
        stream, first = await self._start(engine, request.model, response_id, jobs, sampling)

        def chunk(
            index: int | None,
            text: str = "",
            finish: str | None = None,
            usage: UsageInfo | None = None,
        ) -> str:
            choices = []
            if index is not None:
                choices.append(CompletionStreamChoice(index=index, text=text, finish_reason=finish))
            body = CompletionChunk(
                id=response_id, created=created, model=request.model, choices=choices, usage=usage
            )
            return sse_data(dump_chunk(body))

        templates: dict[int, TextTemplate] = {}

        def text_only(index: int, text: str) -> str:
            if index not in templates:
                body = chunk(index, TextTemplate.SENTINEL)
                templates[index] = TextTemplate(json.loads(body[len("data: ") :]))
            return templates[index].fill(text)

        async def events() -> AsyncIterator[str]:
            prompt_tokens = _prompt_tokens(jobs, request.n)
            async for out in self._relay(stream, first, prompt_tokens, request):
                delta = out.delta
                if delta is not None:
                    if delta.finish_reason is not None:
                        yield chunk(out.index, delta.text, delta.finish_reason)
                    elif delta.text:
                        yield text_only(out.index, delta.text)
                elif out.usage is not None:
                    yield chunk(None, usage=out.usage)
                elif out.error is not None:
                    yield sse_data(out.error.model_dump())
            yield DONE

        return events()

    def _plan_completion(
        self, request: CompletionRequest
    ) -> tuple[LLMEngine, list[_Job], SamplingSettings]:
        engine = self.engine_for(request.model)
        sampling = request.to_sampling()
        sampling.validate()
        jobs = []
        for p, prompt in enumerate(request.prompts()):
            prompt_tokens = self._check_prompt(engine, prompt)
            jobs += [_Job(p * request.n + j, prompt, prompt_tokens) for j in range(request.n)]
        return engine, jobs, sampling

    # -- shared machinery -------------------------------------------------------------------------

    @staticmethod
    def _check_prompt(engine: LLMEngine, prompt: str) -> int:
        prompt_tokens = engine.count_tokens(prompt)
        if prompt_tokens >= engine.max_context_tokens:
            raise PromptTooLong(prompt_tokens, engine.max_context_tokens)
        return prompt_tokens

    async def _observed(
        self, engine: LLMEngine, model: str, request_id: str, job: _Job, sampling: SamplingSettings
    ) -> AsyncIterator[GenerationDelta]:
        """engine.generate with the observer's timings; closing it aborts the generation."""
        observer, clock = self._observer, self._clock
        started = last = clock()
        first_seen = False
        completion_tokens, reason = 0, "abort"
        try:
            async with aclosing(engine.generate(request_id, job.prompt, sampling)) as deltas:
                async for delta in deltas:
                    now = clock()
                    if delta.token_count:
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
                    yield delta
        except Exception:
            reason = "error"
            raise
        finally:
            observer.on_finished(
                model, reason, job.prompt_tokens, completion_tokens, clock() - started
            )

    async def _collect(
        self,
        engine: LLMEngine,
        model: str,
        response_id: str,
        jobs: list[_Job],
        sampling: SamplingSettings,
    ) -> list[_Result]:
        async def run(job: _Job) -> _Result:
            result = _Result()
            gen = self._observed(engine, model, f"{response_id}-{job.index}", job, sampling)
            async with aclosing(gen) as deltas:
                async for delta in deltas:
                    result.text += delta.text
                    result.completion_tokens += delta.token_count
                    result.finish_reason = delta.finish_reason or result.finish_reason
            return result

        # A TaskGroup cancels the sibling generations (and so aborts them) if one fails,
        # and cancelling the caller cancels them all.
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(run(job)) for job in jobs]
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return [task.result() for task in tasks]

    async def _start(
        self,
        engine: LLMEngine,
        model: str,
        response_id: str,
        jobs: list[_Job],
        sampling: SamplingSettings,
    ) -> tuple[_Stream, tuple[int, GenerationDelta]]:
        """Start every generation and wait for the first delta, so early errors raise here."""
        streams = [
            self._observed(engine, model, f"{response_id}-{job.index}", job, sampling)
            for job in jobs
        ]
        merged = _merge([job.index for job in jobs], streams)
        try:
            first = await anext(merged)
        except BaseException:
            await merged.aclose()
            raise
        return merged, first

    async def _relay(
        self,
        stream: _Stream,
        first: tuple[int, GenerationDelta],
        prompt_tokens: int,
        request: ChatCompletionRequest | CompletionRequest,
    ) -> AsyncIterator[_Out]:
        """Every delta, then the usage if asked for; an error after streaming began is relayed
        as one error item, since the HTTP status has already been sent."""
        completion_tokens = 0
        try:
            async with aclosing(stream):
                item: tuple[int, GenerationDelta] | None = first
                while item is not None:
                    completion_tokens += item[1].token_count
                    yield _Out(index=item[0], delta=item[1])
                    item = await anext(stream, None)
        except Exception as exc:
            yield _Out(error=ErrorResponse(error=self._error_info(exc)))
            return
        if request.include_usage:
            yield _Out(usage=UsageInfo.of(prompt_tokens, completion_tokens))


def _prompt_tokens(jobs: list[_Job], n: int) -> int:
    """Each distinct prompt counts once, however many choices it has (as OpenAI bills)."""
    return sum(job.prompt_tokens for job in jobs[::n])


async def _merge(
    indexes: list[int], streams: list[AsyncIterator[GenerationDelta]]
) -> AsyncIterator[tuple[int, GenerationDelta]]:
    """Interleave several generations as they produce; closing this cancels (aborts) them all."""
    queue: asyncio.Queue[tuple[int, GenerationDelta | Exception | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[GenerationDelta]) -> None:
        try:
            async with aclosing(stream) as deltas:  # type: ignore[type-var]
                async for delta in deltas:
                    queue.put_nowait((index, delta))
            queue.put_nowait((index, None))
        except Exception as exc:
            queue.put_nowait((index, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in zip(indexes, streams, strict=True)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
