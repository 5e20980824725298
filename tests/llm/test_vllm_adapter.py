"""VLLMEngine against a fake at the vLLM boundary only: the adapter code runs for real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from ferry.llm.base import GenerationDelta, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import EngineOverloaded, PromptTooLong
from ferry.llm.vllm import VLLMEngine

from tests.gpu import requires_gpu
from tests.llm.llm_paths import HF_DIR, WAIT_S


@dataclass
class CompletionOutput:  # shaped like vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class RequestOutput:  # shaped like vllm.outputs.RequestOutput
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool


@dataclass
class FakeSamplingParams:
    kwargs: dict[str, Any]


def sampling_params(**kwargs: Any) -> FakeSamplingParams:
    return FakeSamplingParams(kwargs)


@dataclass
class FakeAsyncLLM:
    """Streams cumulative outputs for a scripted list of (text, token ids) steps."""

    steps: list[tuple[str, list[int]]]
    finish_reason: str = "length"
    hold: asyncio.Event | None = None  # when set, stream pauses after the first output
    aborted: list[str] = field(default_factory=list)
    calls: list[tuple[Any, Any, str]] = field(default_factory=list)

    async def generate(
        self, prompt: Any, params: Any, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        self.calls.append((prompt, params, request_id))
        text, ids = "", []
        for i, (piece, piece_ids) in enumerate(self.steps):
            text, ids = text + piece, ids + piece_ids
            last = i == len(self.steps) - 1
            completion = CompletionOutput(0, text, list(ids), self.finish_reason if last else None)
            yield RequestOutput(request_id, prompt["prompt_token_ids"], [completion], last)
            if self.hold is not None:
                await self.hold.wait()

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def make_engine(fake: FakeAsyncLLM, **kwargs: Any) -> VLLMEngine:
    return VLLMEngine(
        fake,
        ChatTokenizer(HF_DIR),
        name="tiny-llm",
        max_context_tokens=2048,
        sampling_params_cls=sampling_params,
        **kwargs,
    )


async def collect(engine: VLLMEngine, sampling: SamplingSettings) -> list[GenerationDelta]:
    async def run() -> list[GenerationDelta]:
        return [d async for d in engine.generate("req-1", "hello there", sampling)]

    return await asyncio.wait_for(run(), WAIT_S)


async def test_cumulative_outputs_become_deltas() -> None:
    fake = FakeAsyncLLM(steps=[("Hel", [1, 2]), ("lo", [3]), ("", [4]), (" world", [5])])
    deltas = await collect(make_engine(fake), SamplingSettings(max_tokens=5))
    assert [(d.text, d.token_count) for d in deltas] == [
        ("Hel", 2),
        ("lo", 1),
        ("", 1),
        (" world", 1),
    ]
    assert [d.finish_reason for d in deltas] == [None, None, None, "length"]
    assert fake.aborted == []


async def test_prompt_goes_as_token_ids_of_the_real_tokenizer() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])], finish_reason="stop")
    await collect(make_engine(fake), SamplingSettings())
    prompt, _, request_id = fake.calls[0]
    assert prompt == {"prompt_token_ids": ChatTokenizer(HF_DIR).encode("hello there")}
    assert request_id == "req-1"


async def test_sampling_settings_become_sampling_params() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])], finish_reason="stop")
    sampling = SamplingSettings(max_tokens=9, temperature=0.5, top_p=0.8, seed=3, stop=("\n",))
    deltas = await collect(make_engine(fake), sampling)
    assert deltas[-1].finish_reason == "stop"
    params = fake.calls[0][1].kwargs
    assert params == {
        "n": 1,
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.8,
        "seed": 3,
        "stop": ["\n"],
    }


async def test_max_tokens_are_clamped_to_the_context() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])])
    await collect(make_engine(fake), SamplingSettings(max_tokens=100_000))
    prompt_tokens = len(fake.calls[0][0]["prompt_token_ids"])
    assert fake.calls[0][1].kwargs["max_tokens"] == 2048 - prompt_tokens


async def test_abort_finish_reason_passes_through() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])], finish_reason="abort")
    deltas = await collect(make_engine(fake), SamplingSettings())
    assert deltas[-1].finish_reason == "abort"


async def test_cancelled_consumer_aborts_the_vllm_request() -> None:
    hold = asyncio.Event()
    fake = FakeAsyncLLM(steps=[("a", [1]), ("b", [2])], hold=hold)
    engine = make_engine(fake)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate("req-1", "hi", SamplingSettings()):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_S)
    assert fake.aborted == ["req-1"]
    assert engine.stats().running == 0


async def test_explicit_abort_reaches_vllm() -> None:
    fake = FakeAsyncLLM(steps=[("a", [1])])
    await make_engine(fake).abort("req-9")
    assert fake.aborted == ["req-9"]


async def test_limits_are_checked_before_calling_vllm() -> None:
    fake = FakeAsyncLLM(steps=[("a", [1]), ("b", [2])], hold=asyncio.Event())
    engine = make_engine(fake, max_concurrency=1)
    busy = engine.generate("a", "hi", SamplingSettings())
    await asyncio.wait_for(anext(busy), WAIT_S)
    with pytest.raises(EngineOverloaded):
        await anext(engine.generate("b", "hi", SamplingSettings()))
    with pytest.raises(PromptTooLong):
        await anext(make_engine(fake).generate("c", "x " * 5000, SamplingSettings()))
    await busy.aclose()
    assert fake.aborted == ["a"]
    assert len(fake.calls) == 1


@pytest.mark.gpu
@requires_gpu
async def test_real_vllm_on_the_tiny_model() -> None:
    # `make test-gpu` installs vllm; `make test-gpu VLLM=` leaves it out, and this test says so.
    pytest.importorskip("vllm", reason="vllm is not installed: pip install '.[vllm]'")
    from ferry.llm.vllm import create_vllm_engine

    engine = create_vllm_engine(HF_DIR, max_model_len=512, enforce_eager=True)
    try:
        prompt = engine.render_chat([{"role": "user", "content": "def fibonacci(n):"}])
        sampling = SamplingSettings(max_tokens=8, temperature=0.0)

        async def run() -> list[GenerationDelta]:
            return [d async for d in engine.generate("gpu-1", prompt, sampling)]

        deltas = await asyncio.wait_for(run(), 300)
        assert sum(d.token_count for d in deltas) == 8
        assert deltas[-1].finish_reason == "length"
    finally:
        await engine.close()
