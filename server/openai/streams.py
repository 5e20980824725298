"""Generations as streams: several interleaved into one, and a started one as SSE text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

from ferry.llm.base import GenerationDelta
from ferry.server.dialects import sse_error
from ferry.server.errors import failure
from ferry.server.openai.chunks import StreamChunks
from ferry.server.openai.protocol import UsageInfo
from ferry.server.openai.sse import DONE

# (choice index, delta); a generator, so that it can be closed early
Deltas = AsyncGenerator[tuple[int, GenerationDelta], None]


async def sse_events(
    deltas: Deltas,
    first: tuple[int, GenerationDelta],
    chunks: StreamChunks,
    usage_prompt_tokens: int | None,
    usage_cached: Callable[[dict[int, int]], int | None] = lambda cached: None,
    continuous: bool = False,
) -> AsyncIterator[str]:
    """The SSE text of a started response: deltas, the usage if asked for, then [DONE]. An error
    after streaming began is one error event, since the HTTP status has already been sent.
    `continuous` (vLLM's continuous_usage_stats, with a usage asked for): every chunk carries
    the usage so far."""
    index, delta = first
    completion_tokens = delta.token_count
    cached: dict[int, int] = {}  # choice index -> its prompt tokens the engine reused
    if delta.cached_tokens is not None:
        cached[index] = delta.cached_tokens

    def so_far() -> None:
        if continuous and usage_prompt_tokens is not None:
            usage = UsageInfo.of(usage_prompt_tokens, completion_tokens, usage_cached(cached))
            chunks.running_usage(usage)

    try:
        async with aclosing(deltas):
            so_far()
            yield chunks.opening + chunks.delta(index, delta)
            async for index, delta in deltas:
                completion_tokens += delta.token_count
                if delta.cached_tokens is not None:
                    cached[index] = delta.cached_tokens
                so_far()
                event = chunks.delta(index, delta)
                if event:
                    yield event
    except Exception as exc:
        yield sse_error(failure(exc))
        return
    if usage_prompt_tokens is not None:
        yield chunks.usage(usage_prompt_tokens, completion_tokens, usage_cached(cached))
    yield DONE


async def merge(streams: list[Deltas]) -> Deltas:
    """Interleave several generations as they produce; closing this cancels (aborts) them all."""
    queue: asyncio.Queue[tuple[int, GenerationDelta] | Exception | None] = asyncio.Queue()

    async def pump(stream: Deltas) -> None:
        try:
            async with aclosing(stream) as items:
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
