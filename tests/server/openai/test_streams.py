"""Streams (server/openai/streams.py): generations interleaved into one, and a started response
as SSE text. Plain async generators stand in for engine generations: these functions take any."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from ferry.llm.base import GenerationDelta
from ferry.llm.errors import GenerationFailed
from ferry.server.openai.chunks import completion_chunks
from ferry.server.openai.sse import DONE
from ferry.server.openai.streams import Deltas, merge, sse_events
from tests.llm.llm_paths import WAIT_S

pytestmark = pytest.mark.unit

Item = tuple[int, GenerationDelta]


async def scripted(
    index: int, texts: list[str], closed: list[int], step: asyncio.Event | None = None
) -> Deltas:
    """Choice `index` yielding `texts`, recording in `closed` when it is shut (as an engine
    aborts); with `step`, it waits for it before each delta after the first."""
    try:
        for i, text in enumerate(texts):
            if step is not None and i:
                await step.wait()
            last = i == len(texts) - 1
            yield index, GenerationDelta(text, 1, "stop" if last else None)
    finally:
        closed.append(index)


async def failing(index: int) -> Deltas:
    yield index, GenerationDelta("a", 1)
    raise GenerationFailed("the runtime failed this request")


async def items(deltas: AsyncIterator[Item]) -> list[Item]:
    async def run() -> list[Item]:
        return [item async for item in deltas]

    return await asyncio.wait_for(run(), WAIT_S)


async def test_merge_yields_every_delta_of_every_generation() -> None:
    closed: list[int] = []
    merged = await items(merge([scripted(0, ["a", "b"], closed), scripted(1, ["c"], closed)]))
    assert sorted((i, d.text) for i, d in merged) == [(0, "a"), (0, "b"), (1, "c")]
    by_choice = [[d.text for i, d in merged if i == k] for k in (0, 1)]
    assert by_choice == [["a", "b"], ["c"]]  # each generation's order kept
    assert sorted(closed) == [0, 1]


async def test_closing_the_merge_aborts_every_generation_still_running() -> None:
    closed: list[int] = []
    never = asyncio.Event()
    merged = merge([scripted(k, ["a", "b"], closed, never) for k in range(3)])
    await asyncio.wait_for(anext(merged), WAIT_S)
    await asyncio.wait_for(merged.aclose(), WAIT_S)
    assert sorted(closed) == [0, 1, 2]


async def test_a_failed_generation_fails_the_merge_and_stops_the_others() -> None:
    closed: list[int] = []
    never = asyncio.Event()
    with pytest.raises(GenerationFailed):
        await items(merge([failing(0), scripted(1, ["a", "b"], closed, never)]))
    assert closed == [1]


def events(text: list[str]) -> list[dict | str]:
    out: list[dict | str] = []
    for event in text:
        for line in event.split("\n\n"):
            if line:
                assert line.startswith("data: ")
                body = line.removeprefix("data: ")
                out.append(body if body == "[DONE]" else json.loads(body))
    return out


async def started(stream: Deltas) -> tuple[Deltas, Item]:
    return stream, await anext(stream)


@pytest.mark.parametrize("usage", [None, 7])
async def test_sse_sends_each_delta_then_the_usage_if_asked_then_done(usage) -> None:
    deltas, first = await started(scripted(0, ["Hel", "lo"], []))
    chunks = completion_chunks("cmpl-1", "m")
    sent = [e async for e in sse_events(deltas, first, chunks, usage)]
    assert sent[-1] == DONE
    parsed = events(sent)
    texts = [e["choices"][0]["text"] for e in parsed if isinstance(e, dict) and e["choices"]]
    assert texts == ["Hel", "lo"]
    if usage is not None:
        assert parsed[-2]["usage"]["prompt_tokens"] == 7
        assert parsed[-2]["usage"]["completion_tokens"] == 2  # both deltas counted
    else:
        assert all("usage" not in e for e in parsed if isinstance(e, dict))


async def test_an_error_after_streaming_began_is_one_error_event_then_done() -> None:
    deltas, first = await started(failing(0))
    sent = [e async for e in sse_events(deltas, first, completion_chunks("cmpl-1", "m"), 5)]
    parsed = events(sent)
    assert parsed[0]["choices"][0]["text"] == "a"
    assert parsed[1]["error"]["type"] == "internal_error"
    assert "failed this request" in parsed[1]["error"]["message"]
    assert parsed[2:] == ["[DONE]"]  # no usage after an error


async def test_continuous_usage_puts_the_usage_so_far_on_every_chunk() -> None:
    deltas, first = await started(scripted(0, ["Hel", "lo"], []))
    chunks = completion_chunks("cmpl-1", "m")
    sent = [e async for e in sse_events(deltas, first, chunks, 7, continuous=True)]
    parsed = [e for e in events(sent) if isinstance(e, dict)]
    assert [e["usage"]["completion_tokens"] for e in parsed] == [1, 2, 2]  # then the usage chunk
    assert {e["usage"]["prompt_tokens"] for e in parsed} == {7}
