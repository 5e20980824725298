"""OrtGenAIEngine on the real tiny model: streaming, stops, limits, concurrency, abort, overload."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import pytest

from ferry.llm.base import GenerationDelta, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import EngineDead, EngineOverloaded
from ferry.llm.ortgenai import OrtGenAIEngine
from ferry.llm.ortgenai_owner import OwnerLoop
from tests.llm.llm_paths import HF_DIR, ONNX_DIR, WAIT_S

pytestmark = pytest.mark.unit

GREEDY = SamplingSettings(max_tokens=20, temperature=0.0)
LONG = SamplingSettings(max_tokens=1500, temperature=0.0)
EOS_PROMPT = [{"role": "user", "content": "def fibonacci(n):"}]  # greedy ends in <|im_end|>


TOKENIZER = ChatTokenizer(HF_DIR)


def ids(prompt: str) -> list[int]:
    return TOKENIZER.encode(prompt)


async def collect(
    engine: OrtGenAIEngine, request_id: str, prompt: str, sampling: SamplingSettings
) -> list[GenerationDelta]:
    async def run() -> list[GenerationDelta]:
        return [d async for d in engine.generate(request_id, ids(prompt), sampling)]

    return await asyncio.wait_for(run(), WAIT_S)


def reference_text(case: dict[str, Any]) -> str:
    return TOKENIZER.decode(case["new_ids"])


async def test_streamed_deltas_concatenate_to_the_greedy_reference(
    engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    case = reference["cases"][0]
    deltas = await collect(engine, "r1", case["prompt"], GREEDY)
    assert "".join(d.text for d in deltas) == reference_text(case)
    assert sum(d.token_count for d in deltas) == 20
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)


async def test_max_tokens_finishes_with_length(
    engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    sampling = SamplingSettings(max_tokens=5, temperature=0.0)
    deltas = await collect(engine, "r1", reference["cases"][1]["prompt"], sampling)
    assert sum(d.token_count for d in deltas) == 5
    assert deltas[-1].finish_reason == "length"


async def test_eos_finishes_with_stop(engine: OrtGenAIEngine) -> None:
    prompt = engine.tokenizer.render_chat(EOS_PROMPT)
    deltas = await collect(engine, "r1", prompt, SamplingSettings(max_tokens=400, temperature=0))
    assert deltas[-1].finish_reason == "stop"
    assert sum(d.token_count for d in deltas) < 400
    assert "<|im_end|>" not in "".join(d.text for d in deltas)


async def test_stop_string_cuts_the_text_before_it(
    engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    case = reference["cases"][0]
    full = reference_text(case)
    stop = full[12:16]
    assert full.index(stop) == 12
    sampling = SamplingSettings(max_tokens=20, temperature=0.0, stop=(stop,))
    deltas = await collect(engine, "r1", case["prompt"], sampling)
    assert "".join(d.text for d in deltas) == full[:12]
    assert deltas[-1].finish_reason == "stop"


async def test_sampling_settings_reach_the_runtime(
    engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    prompt = reference["cases"][0]["prompt"]
    hot = SamplingSettings(max_tokens=20, temperature=1.5, top_p=0.9)
    texts = {"".join(d.text for d in await collect(engine, f"r{i}", prompt, hot)) for i in range(3)}
    assert len(texts) > 1  # sampling, not greedy


@pytest.mark.parametrize("field", ["temperature", "top_p"])
async def test_a_vanishing_temperature_or_top_p_is_the_greedy_answer(
    engine: OrtGenAIEngine, reference: dict[str, Any], field: str
) -> None:
    # 5e-324 is 0 in the runtime's float32, which it refuses: the limit of both is greedy.
    case = reference["cases"][0]
    tiny = SamplingSettings(max_tokens=20, **{field: 5e-324})
    deltas = await collect(engine, "r1", case["prompt"], tiny)
    assert "".join(d.text for d in deltas) == reference_text(case)


async def test_concurrent_generations_all_complete_without_cross_talk(
    engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    # That they run side by side is test_ortgenai_owner's join-at-once test: the toy decodes 8 x 20
    # tokens faster than the event loop reads one delta, so a running count read here is timing.
    cases = reference["cases"]
    prompts = [ids(case["prompt"]) for case in cases]

    async def one(i: int) -> str:
        text = ""
        async for delta in engine.generate(f"r{i}", prompts[i % 3], GREEDY):
            text += delta.text
        return text

    texts = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(8))), WAIT_S)
    assert texts == [reference_text(cases[i % 3]) for i in range(8)]  # no cross-talk
    assert engine.stats().running == engine.stats().waiting == 0


async def wait_until(condition: Callable[[], bool]) -> None:
    """Poll a condition the owner thread makes true; bounded, so a bug fails instead of hangs."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), WAIT_S)


async def wait_idle(engine: OrtGenAIEngine) -> None:
    await wait_until(lambda: engine.stats().running == engine.stats().waiting == 0)


@pytest.fixture
def runtime_tokens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Request ids of every token event the runtime produced (a spy; the real method runs)."""
    seen: list[str] = []
    original = OwnerLoop._advance

    def spy(self: OwnerLoop, job: Any, token: int | None, finish: Any) -> None:
        seen.append(job.add.request_id)
        original(self, job, token, finish)

    monkeypatch.setattr(OwnerLoop, "_advance", spy)
    return seen


async def test_closing_the_stream_aborts_the_generation(
    engine: OrtGenAIEngine, reference: dict[str, Any], runtime_tokens: list[str]
) -> None:
    prompt = reference["cases"][1]["prompt"]
    received = 0
    async with aclosing(engine.generate("r1", ids(prompt), LONG)) as deltas:
        async for delta in deltas:
            received += delta.token_count
            if received >= 3:
                break
    await wait_idle(engine)
    assert runtime_tokens.count("r1") < 100  # the runtime stopped long before 1500 tokens
    # The engine is free for the next request at once.
    # Greedy: a sampled token may be the end of sequence, and then the finish is "stop".
    deltas_after = await collect(
        engine, "r2", prompt, SamplingSettings(max_tokens=2, temperature=0)
    )
    assert deltas_after[-1].finish_reason == "length"


async def test_cancelling_the_consumer_task_aborts(
    engine: OrtGenAIEngine, reference: dict[str, Any], runtime_tokens: list[str]
) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate("r1", ids(reference["cases"][0]["prompt"]), LONG):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_idle(engine)
    assert runtime_tokens.count("r1") < 100


async def test_beyond_running_and_waiting_slots_raises_overloaded(
    reference: dict[str, Any],
) -> None:
    engine = OrtGenAIEngine(ONNX_DIR, max_running=1, max_waiting=1)
    await engine.start()
    prompt = ids(reference["cases"][0]["prompt"])
    first = engine.generate("a", prompt, LONG)
    second = engine.generate("b", prompt, LONG)
    waiting = None
    try:
        await asyncio.wait_for(anext(first), WAIT_S)  # running
        waiting = asyncio.ensure_future(anext(second))  # admitted, queued behind "a"
        await wait_until(lambda: engine.stats().waiting == 1)
        with pytest.raises(EngineOverloaded):
            await anext(engine.generate("c", prompt, GREEDY))
        await first.aclose()  # frees the slot: "b" starts
        assert (await asyncio.wait_for(waiting, WAIT_S)).token_count >= 1
    finally:
        if waiting is not None and not waiting.done():
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        await first.aclose()
        await second.aclose()
        await engine.close()


async def test_engine_thread_death_fails_requests_and_readiness(
    engine: OrtGenAIEngine, reference: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fault injection at the runtime step; everything around it runs for real.
    def broken_step(self: OwnerLoop, commands: object) -> bool:
        raise RuntimeError("simulated runtime crash")

    monkeypatch.setattr(OwnerLoop, "_step_lanes", broken_step)
    with pytest.raises(EngineDead):
        await collect(engine, "r1", reference["cases"][0]["prompt"], GREEDY)
    assert not engine.is_ready()
    with pytest.raises(EngineDead):
        await collect(engine, "r2", reference["cases"][0]["prompt"], GREEDY)


async def test_close_makes_the_engine_not_ready(reference: dict[str, Any]) -> None:
    engine = OrtGenAIEngine(ONNX_DIR)
    assert not engine.is_ready()
    await engine.start()
    assert engine.is_ready()
    await engine.close()
    assert not engine.is_ready()
    with pytest.raises(EngineDead):
        await collect(engine, "r1", reference["cases"][0]["prompt"], GREEDY)


async def test_echo_never_loads_the_weights_a_second_time(
    monkeypatch: pytest.MonkeyPatch, reference: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """og.Model is a second copy of the weights next to the batch lane's session, loaded only
    for adapters (the generator lane): not at start, for plain requests or for `echo`."""
    import onnxruntime_genai as og

    loads: list[str] = []
    real_model = og.Model

    def counted(path: str) -> Any:
        loads.append(path)
        return real_model(path)

    monkeypatch.setattr(og, "Model", counted)
    caplog.set_level(logging.INFO, logger="ferry.llm.ortgenai_owner")
    engine = OrtGenAIEngine(ONNX_DIR, name="once")
    await engine.start()
    try:
        prompt = reference["cases"][0]["prompt"]
        await collect(engine, "plain", prompt, GREEDY)
        echo = SamplingSettings(max_tokens=2, temperature=0.0, logprobs=1, echo=True)
        deltas = await collect(engine, "echo", prompt, echo)
        assert deltas[0].prompt_logprobs is not None
        assert len(deltas[0].prompt_logprobs) == len(ids(prompt))
        assert loads == []
        assert "for its generator lane" not in caplog.text
    finally:
        await engine.close()
