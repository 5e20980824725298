"""OpenAIServing + protocol with the real onnxruntime-genai engine (no HTTP, no mocks)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import EngineOverloaded, InvalidSampling, PromptTooLong
from ferry.llm.ortgenai import OrtGenAIEngine
from ferry.llm.ortgenai_owner import OwnerLoop
from ferry.server.errors import UnknownModel
from ferry.server.openai.observer import GenerationObserver
from ferry.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from ferry.server.openai.serving import OpenAIServing
from ferry.server.registry import ModelRegistry
from tests.llm.llm_paths import HF_DIR, MODEL_NAME, ONNX_DIR, WAIT_S

pytestmark = pytest.mark.unit


@dataclass
class RecordingObserver(GenerationObserver):
    first: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    finished_: list[tuple[str, int, int]] = field(default_factory=list)
    structured_: list[str] = field(default_factory=list)
    guided_gaps: list[float] = field(default_factory=list)

    def for_model(self, model: str) -> GenerationObserver:
        assert model == MODEL_NAME
        return self

    def first_token(self, seconds: float) -> None:
        self.first.append(seconds)

    def token(self, seconds_since_last: float) -> None:
        self.gaps.append(seconds_since_last)

    def structured(self, kind: str) -> None:
        self.structured_.append(kind)

    def guided_token(self, seconds_since_last: float) -> None:
        self.guided_gaps.append(seconds_since_last)

    def finished(self, reason: str, prompt: int, generated: int, seconds: float) -> None:
        self.finished_.append((reason, prompt, generated))


@pytest.fixture
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture
def serving(engine: OrtGenAIEngine, observer: RecordingObserver) -> OpenAIServing:
    return OpenAIServing(ModelRegistry(llms={MODEL_NAME: engine}), observer=observer)


def chat_request(case: dict[str, Any], **kwargs: Any) -> ChatCompletionRequest:
    fields = {"model": MODEL_NAME, "messages": case["messages"], "max_tokens": 20}
    fields.update(temperature=0, **kwargs)
    return ChatCompletionRequest.model_validate(fields)


def reference_text(case: dict[str, Any]) -> str:
    return ChatTokenizer(HF_DIR).decode(case["new_ids"])


async def read_sse(stream: AsyncIterator[str]) -> list[Any]:
    """Parse SSE text into JSON payloads; the literal [DONE] marker is kept as a string."""

    async def read() -> list[Any]:
        events = []
        async for text in stream:  # one piece of text may hold several events
            assert text.startswith("data: ") and text.endswith("\n\n"), text
            for event in text[:-2].split("\n\n"):
                assert event.startswith("data: ") and "\n" not in event, event
                data = event[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
        return events

    return await asyncio.wait_for(read(), WAIT_S)


async def test_chat_non_streaming(
    serving: OpenAIServing, reference: dict[str, Any], observer: RecordingObserver
) -> None:
    case = reference["cases"][0]
    response = await asyncio.wait_for(serving.chat(chat_request(case)), WAIT_S)
    parsed = ChatCompletion.model_validate(response.model_dump())
    assert parsed.id.startswith("chatcmpl-")
    assert parsed.choices[0].message.content == reference_text(case)
    assert parsed.choices[0].finish_reason == "length"
    prompt_tokens = len(case["prompt_ids"])
    assert response.usage.model_dump() == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 20,
        "total_tokens": prompt_tokens + 20,
        "prompt_tokens_details": {"cached_tokens": 0},  # a fresh engine has nothing cached
    }
    assert len(observer.first) == 1
    assert len(observer.gaps) == 19
    assert observer.finished_ == [("length", prompt_tokens, 20)]


async def test_chat_streaming_with_usage(serving: OpenAIServing, reference: dict[str, Any]) -> None:
    case = reference["cases"][1]
    request = chat_request(case, stream=True, stream_options={"include_usage": True})
    events = await read_sse(await serving.chat_stream(request))
    assert events[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(e) for e in events[:-1]]
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference_text(case)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 20
    assert usage_chunk.usage.prompt_tokens == len(case["prompt_ids"])
    assert all(c.usage is None for c in chunks[:-1])


async def test_chat_streaming_without_usage_has_no_usage_chunk(
    serving: OpenAIServing, reference: dict[str, Any]
) -> None:
    events = await read_sse(await serving.chat_stream(chat_request(reference["cases"][0])))
    assert all(e == "[DONE]" or "usage" not in e for e in events)


async def test_chat_n_runs_n_generations(serving: OpenAIServing, reference: dict[str, Any]) -> None:
    case = reference["cases"][2]
    response = await asyncio.wait_for(serving.chat(chat_request(case, n=3)), WAIT_S)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert {c.message.content for c in response.choices} == {reference_text(case)}
    assert response.usage.completion_tokens == 60
    assert response.usage.prompt_tokens == len(case["prompt_ids"])


async def test_chat_streaming_n_interleaves_choices(
    serving: OpenAIServing, reference: dict[str, Any]
) -> None:
    case = reference["cases"][0]
    events = await read_sse(await serving.chat_stream(chat_request(case, n=2)))
    chunks = [ChatCompletionChunk.model_validate(e) for e in events[:-1]]
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.delta.content or "" for c in mine) == reference_text(case)
        assert mine[-1].finish_reason == "length"


async def test_chat_stop_string(serving: OpenAIServing, reference: dict[str, Any]) -> None:
    case = reference["cases"][0]
    full = reference_text(case)
    response = await serving.chat(chat_request(case, stop=[full[12:16], "never-there"]))
    assert response.choices[0].message.content == full[:12]
    assert response.choices[0].finish_reason == "stop"


async def test_chat_length(serving: OpenAIServing, reference: dict[str, Any]) -> None:
    response = await serving.chat(chat_request(reference["cases"][0], max_completion_tokens=4))
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 4


async def test_completions_with_prompt_list_and_n(
    serving: OpenAIServing, engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    prompts = [reference["cases"][0]["prompt"], reference["cases"][1]["prompt"]]
    request = CompletionRequest(model=MODEL_NAME, prompt=prompts, n=2, max_tokens=20, temperature=0)
    response = await asyncio.wait_for(serving.completion(request), WAIT_S)
    parsed = Completion.model_validate(response.model_dump())
    assert parsed.id.startswith("cmpl-")
    expected = [reference_text(reference["cases"][i // 2]) for i in range(4)]
    assert [c.text for c in response.choices] == expected
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert response.usage.prompt_tokens == sum(len(engine.tokenizer.encode(p)) for p in prompts)
    assert response.usage.completion_tokens == 80


async def test_completion_streaming(serving: OpenAIServing, reference: dict[str, Any]) -> None:
    case = reference["cases"][2]
    request = CompletionRequest(
        model=MODEL_NAME,
        prompt=case["prompt"],
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    events = await read_sse(await serving.completion_stream(request))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]  # the SDK parses these unvalidated: finish_reason is null mid-stream
    assert {c["object"] for c in chunks} == {"text_completion"}
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert all(set(c) == {"index", "text", "logprobs", "finish_reason"} for c in choices)
    assert "".join(c["text"] for c in choices) == reference_text(case)
    assert choices[-1]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 20


async def test_errors_before_streaming_raise(
    serving: OpenAIServing, reference: dict[str, Any]
) -> None:
    case = reference["cases"][0]
    with pytest.raises(UnknownModel):
        await serving.chat(chat_request(case, model="no-such-model"))
    too_long = {"messages": [{"role": "user", "content": "x " * 3000}]}
    with pytest.raises(PromptTooLong):
        await serving.chat_stream(chat_request(too_long, stream=True))
    with pytest.raises(PromptTooLong):
        await serving.completion(CompletionRequest(model=MODEL_NAME, prompt=["hi", "x " * 3000]))
    # An empty stop string never reaches the serving layer: the request schema refuses it.
    with pytest.raises(ValidationError, match="stop"):
        chat_request(case, stop=[""])


async def wait_idle(engine: OrtGenAIEngine) -> None:
    async def idle() -> None:
        while engine.stats().running or engine.stats().waiting:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(idle(), WAIT_S)


async def test_cancelling_a_stream_consumer_aborts_its_generations(
    serving: OpenAIServing,
    engine: OrtGenAIEngine,
    reference: dict[str, Any],
    observer: RecordingObserver,
) -> None:
    request = chat_request(reference["cases"][0], n=2, max_tokens=1500)
    stream = await serving.chat_stream(request)
    got_content = asyncio.Event()

    async def consume() -> None:
        async for line in stream:
            if '"content":"' in line and '"content":""' not in line:
                got_content.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_content.wait(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_idle(engine)
    assert sorted(reason for reason, _, _ in observer.finished_) == ["abort", "abort"]
    assert all(tokens < 1500 for _, _, tokens in observer.finished_)


async def test_cancelling_a_chat_call_aborts_it(
    serving: OpenAIServing, engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    task = asyncio.create_task(serving.chat(chat_request(reference["cases"][0], max_tokens=1500)))

    async def running() -> None:
        while not engine.stats().running:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(running(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_idle(engine)


async def test_error_after_streaming_began_is_an_sse_error_event(
    serving: OpenAIServing, reference: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = await serving.chat_stream(chat_request(reference["cases"][0], max_tokens=200))
    original = OwnerLoop._step_lanes

    def crash_soon(self: OwnerLoop, commands: object, calls: list[int] = []) -> bool:  # noqa: B006
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("simulated runtime crash")
        return original(self, commands)

    monkeypatch.setattr(OwnerLoop, "_step_lanes", crash_soon)  # fault injection after the start
    events = await read_sse(stream)
    assert events[-1] == "[DONE]"
    # The same error table as HTTP answers: a dead engine is a 503.
    assert events[-2]["error"]["type"] == "unavailable_error"
    assert events[-2]["error"]["code"] == 503
    assert any("choices" in e for e in events[:-2])


async def test_a_single_choice_streams_without_an_extra_task(
    serving: OpenAIServing, reference: dict[str, Any]
) -> None:
    before = asyncio.all_tasks()
    stream = await serving.chat_stream(chat_request(reference["cases"][0], max_tokens=1500))
    assert (await anext(stream)).startswith("data: ")
    assert asyncio.all_tasks() == before  # n = 1: the engine's deltas go straight to chunks
    await stream.aclose()


async def test_a_request_shed_by_a_full_engine_counts_as_rejected_not_error(
    observer: RecordingObserver,
) -> None:
    engine = OrtGenAIEngine(ONNX_DIR, name=MODEL_NAME, max_running=1, max_waiting=0)
    await engine.start()
    serving = OpenAIServing(ModelRegistry(llms={MODEL_NAME: engine}), observer=observer)
    case = {"messages": [{"role": "user", "content": "count to nine"}]}
    try:
        running = await serving.chat_stream(chat_request(case, max_tokens=1000))
        first = await asyncio.wait_for(anext(running), WAIT_S)  # holds the only slot
        assert first.startswith("data: ")
        with pytest.raises(EngineOverloaded):
            await serving.chat(chat_request(case))
        assert [reason for reason, _, _ in observer.finished_] == ["rejected"]
        await running.aclose()
    finally:
        await engine.close()


async def test_guided_requests_are_counted_by_kind_and_their_tokens_timed(
    serving: OpenAIServing, observer: RecordingObserver, reference: dict[str, Any]
) -> None:
    case = reference["cases"][0]
    request = chat_request(case, max_tokens=4, guided_choice=["yes", "no"], n=2)
    response = await asyncio.wait_for(serving.chat(request), WAIT_S)
    assert {c.message.content for c in response.choices} <= {"yes", "no"}
    assert observer.structured_ == ["guided_choice"]  # once per request, not per choice
    assert len(observer.guided_gaps) == len(observer.gaps)  # every token was guided
    await asyncio.wait_for(serving.chat(chat_request(case, max_tokens=3)), WAIT_S)
    assert observer.structured_ == ["guided_choice"]
    assert len(observer.guided_gaps) < len(observer.gaps)


async def test_requests_are_refused_whole_before_any_work(observer: RecordingObserver) -> None:
    # Room for 3 generations: 1 running + 2 waiting.
    engine = OrtGenAIEngine(ONNX_DIR, name=MODEL_NAME, max_running=1, max_waiting=2)
    await engine.start()
    serving = OpenAIServing(ModelRegistry(llms={MODEL_NAME: engine}), observer=observer)
    assert engine.max_concurrent_generations == 3

    def completion(prompts: int, n: int) -> CompletionRequest:
        fields = {"model": MODEL_NAME, "prompt": ["def"] * prompts, "n": n, "max_tokens": 4}
        return CompletionRequest.model_validate(fields)

    try:
        # Bigger than the engine could ever hold: a 400 naming the field, nothing started.
        for prompts, n, param in ((4, 1, "prompt"), (2, 2, "n"), (4, 2, "prompt")):
            with pytest.raises(InvalidSampling) as refused:
                await serving.completion(completion(prompts, n))
            assert refused.value.field == param
        assert observer.finished_ == []
        # One generation holds a slot: a request for all 3 is refused whole, none of its own
        # generations started (they would have been aborted, not rejected).
        case = {"messages": [{"role": "user", "content": "count to nine"}]}
        running = await serving.chat_stream(chat_request(case, max_tokens=1000))
        assert (await asyncio.wait_for(anext(running), WAIT_S)).startswith("data: ")
        with pytest.raises(EngineOverloaded, match="needs 3"):
            await serving.completion(completion(3, 1))
        assert [reason for reason, _, _ in observer.finished_] == ["rejected"] * 3
        assert engine.stats().running + engine.stats().waiting == 1
        await running.aclose()
        # Once the slot is free the same request fits: the 429 was one a retry gets past.
        answer = await asyncio.wait_for(serving.completion(completion(3, 1)), WAIT_S)
        assert len(answer.choices) == 3
    finally:
        await engine.close()
