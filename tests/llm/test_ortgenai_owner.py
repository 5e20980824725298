"""The engine's scheduling on the real SmolLM2-135M-Instruct (int4, CPU): a request joins while
others decode, greedy text does not depend on load or on the prefix cache, chats reuse their
previous turns, waiting work starts by priority. Short generations keep it cheap."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from ferry.llm.base import GenerationDelta, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.ortgenai import OrtGenAIEngine
from ferry.llm.ortgenai_kv import KVModel
from ferry.llm.ortgenai_owner import (
    STOP,
    AbortRequest,
    AddRequest,
    EngineOptions,
    OwnerCall,
    OwnerLoop,
)
from tests.llm.llm_paths import HF_DIR, ONNX_DIR, REAL_MODEL, WAIT_S, onnx_adapter

pytestmark = pytest.mark.unit

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer in one sentence."}
QUESTIONS = (
    "What is the capital of France?",
    "Name a primary colour.",
    "What do bees make?",
    "How many legs does a spider have?",
)
# Greedy answers of at least 150 tokens (measured), so none can end before the test looks.
LONG_TASKS = (
    "Write a long story about a dragon.",
    "Write a detailed essay on the history of Rome.",
    "Explain in detail how computers work.",
    "Write a long poem about the ocean.",
)
GREEDY = SamplingSettings(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def real_model() -> Path:
    assert (REAL_MODEL / "genai_config.json").is_file(), "run `make model` first"
    return REAL_MODEL


async def started(model: Path, **options: object) -> OrtGenAIEngine:
    engine = OrtGenAIEngine(model, name="smol", **options)  # type: ignore[arg-type]
    await engine.start()
    return engine


def chat_ids(engine: OrtGenAIEngine, question: str) -> list[int]:
    return engine.tokenizer.encode_chat([SYSTEM, {"role": "user", "content": question}])


async def text_of(deltas: AsyncIterator[GenerationDelta]) -> str:
    async def run() -> str:
        return "".join([d.text async for d in deltas])

    return await asyncio.wait_for(run(), WAIT_S)


async def test_a_request_arriving_while_four_decode_starts_before_any_finishes(
    real_model: Path,
) -> None:
    engine = await started(real_model, max_running=8)
    events: list[str] = []
    long = SamplingSettings(max_tokens=400, temperature=0.0)

    async def consume(name: str, task: str, sampling: SamplingSettings) -> None:
        prompt = engine.tokenizer.encode_chat([{"role": "user", "content": task}])
        async with aclosing(engine.generate(name, prompt, sampling)) as it:
            async for delta in it:
                if delta.token_count and f"{name} first" not in events:
                    events.append(f"{name} first")
                if delta.finish_reason is not None:
                    events.append(f"{name} done")
                if name == "late" and delta.token_count:
                    return  # seen its first token: the test has what it needs

    try:
        decoding = [
            asyncio.create_task(consume(f"r{i}", t, long)) for i, t in enumerate(LONG_TASKS)
        ]

        async def four_decoding() -> None:
            while sum(e.endswith("first") for e in events) < 4:
                await asyncio.sleep(0.001)

        await asyncio.wait_for(four_decoding(), WAIT_S)
        await asyncio.wait_for(consume("late", "Say hello.", GREEDY), WAIT_S)
        assert "late first" in events
        assert not any(e.endswith("done") for e in events)  # none of the four has finished
    finally:
        for task in decoding:
            task.cancel()
        await asyncio.gather(*decoding, return_exceptions=True)
        await engine.close()


async def test_greedy_text_is_the_single_stream_reference_under_load(real_model: Path) -> None:
    # In the deterministic mode (the default batches a lone request's decode differently).
    # The reference: one request at a time, nothing cached.
    alone = await started(real_model, prefix_cache=False, deterministic=True)
    try:
        reference = [
            await text_of(alone.generate(f"a{i}", chat_ids(alone, q), GREEDY))
            for i, q in enumerate(QUESTIONS)
        ]
    finally:
        await alone.close()
    # Under load: every question twice at once (the second copies may take the first ones'
    # cached prefixes), with prompts going in a few tokens per turn.
    busy = await started(real_model, max_running=8, prefill_chunk=7, deterministic=True)
    try:
        prompts = [chat_ids(busy, q) for q in QUESTIONS] * 2
        texts = await asyncio.gather(
            *(text_of(busy.generate(f"b{i}", p, GREEDY)) for i, p in enumerate(prompts))
        )
        again = await text_of(busy.generate("c", prompts[0], GREEDY))  # a whole-prompt hit
        assert busy.stats().prefix_cache_hits > 0
    finally:
        await busy.close()
    assert texts == reference * 2
    assert again == reference[0]
    assert len(set(reference)) == len(reference)  # four different answers, not one echoed


async def test_a_chat_turn_reuses_the_previous_turn(real_model: Path) -> None:
    engine = await started(real_model)
    try:
        first = [SYSTEM, {"role": "user", "content": QUESTIONS[0]}]
        first_ids = engine.tokenizer.encode_chat(first)
        answer = await text_of(engine.generate("t1", first_ids, GREEDY))
        second = [*first, {"role": "assistant", "content": answer}]
        second_ids = engine.tokenizer.encode_chat([*second, {"role": "user", "content": "Why?"}])
        deltas = [d async for d in engine.generate("t2", second_ids, GREEDY)]
        assert deltas[0].cached_tokens >= len(first_ids)  # the whole first turn, and more
        reused = "".join(d.text for d in deltas)
    finally:
        await engine.close()
    cold = await started(real_model, prefix_cache=False)
    try:
        assert await text_of(cold.generate("t2", second_ids, GREEDY)) == reused
    finally:
        await cold.close()


async def test_waiting_requests_start_lowest_priority_first(reference: dict[str, Any]) -> None:
    engine = await started(ONNX_DIR, max_running=1)
    order: list[str] = []
    prompt = engine.tokenizer.encode(reference["cases"][1]["prompt"])  # greedy: no early end

    async def run(name: str, priority: int) -> None:
        deltas = engine.generate(
            name, prompt, SamplingSettings(max_tokens=2, temperature=0), priority=priority
        )
        async with aclosing(deltas) as it:
            async for _ in it:
                if name not in order:
                    order.append(name)

    try:
        hold = engine.generate("hold", prompt, SamplingSettings(max_tokens=400, temperature=0))
        await asyncio.wait_for(anext(hold), WAIT_S)  # the only running slot is taken
        tasks = [asyncio.create_task(run(n, p)) for n, p in (("low", 5), ("high", 0), ("mid", 2))]

        async def three_waiting() -> None:
            while engine.stats().waiting < 3:
                await asyncio.sleep(0.001)

        await asyncio.wait_for(three_waiting(), WAIT_S)
        await hold.aclose()
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    finally:
        await engine.close()
    assert order == ["high", "mid", "low"]


def test_a_turns_tokens_go_out_as_the_next_forward_pass_starts(
    kv_model: KVModel, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two decode steps the owner reads its commands and binds the next step's inputs
    before it wakes the event loop: the loop's work for every stream (it takes the GIL)
    overlaps the forward pass instead of the gap between steps."""
    events: list[str] = []
    outbox: list[GenerationDelta] = []

    class Commands(queue.Queue[object]):
        def get(self, block: bool = True, timeout: float | None = None) -> object:
            events.append("commands")  # get_nowait comes here too
            return super().get(block, timeout)

    commands = Commands()

    def deliver(request_id: str, delta: GenerationDelta | Exception) -> None:
        assert isinstance(delta, GenerationDelta)
        outbox.append(delta)
        if delta.finish_reason is not None:
            commands.put(STOP)

    def flush() -> None:
        if outbox:
            events.append("flush")
            outbox.clear()

    run = kv_model._session.run_with_iobinding
    monkeypatch.setattr(
        kv_model._session, "run_with_iobinding", lambda *a: events.append("forward") or run(*a)
    )
    tokenizer = ChatTokenizer(REAL_MODEL).tokenizer
    options = EngineOptions(prefix_cache=False)
    owner = OwnerLoop(None, "m", kv_model, tokenizer, options, {2}, deliver, _ignore, flush)
    commands.put(AddRequest("a", prompts[0], SamplingSettings(max_tokens=5, temperature=0.0)))
    owner.serve(commands)
    owner.release()
    flushes = [i for i, event in enumerate(events) if event == "flush"]
    assert len(flushes) == 5  # a token a turn, the first from its prompt
    # Every flush but the last (the request is over) is the start of a forward pass: after a
    # first token, at most a look at the commands between (arrivals join the turn).
    after = [next(e for e in events[i + 1 :] if e != "commands") for i in flushes[:-1]]
    assert after == ["forward"] * 4, events


def test_a_request_arriving_during_a_prompt_goes_in_before_the_turns_decode_step(
    kv_model: KVModel, prompts: list[list[int]]
) -> None:
    """A burst's requests reach the owner one by one; one that arrives while another's prompt
    goes in has its prompt go in the same turn, so its first token does not wait for the decode
    step of the requests admitted before it."""
    commands: queue.Queue[object] = queue.Queue()
    order: list[str] = []
    greedy = SamplingSettings(max_tokens=3, temperature=0.0)

    def deliver(request_id: str, delta: GenerationDelta | Exception) -> None:
        assert isinstance(delta, GenerationDelta)
        order.append(request_id)
        if order == ["a"]:  # b arrives while a's first token goes out
            commands.put(AddRequest("b", prompts[1], greedy))
        if order.count("b") == 3:
            commands.put(STOP)

    tokenizer = ChatTokenizer(REAL_MODEL).tokenizer
    options = EngineOptions(prefix_cache=False)
    owner = OwnerLoop(None, "m", kv_model, tokenizer, options, {2}, deliver, _ignore, _ignore)
    commands.put(AddRequest("a", prompts[0], greedy))
    owner.serve(commands)
    owner.release()
    assert order[:3] == ["a", "b", "a"]  # b's first token before a's second


def test_a_stop_read_during_a_turn_ends_the_owner_after_that_turn(
    kv_model: KVModel, prompts: list[list[int]]
) -> None:
    """A STOP read with the arrivals at a first token is not lost: the turn ends, then the
    owner returns, with the long request far from its end."""
    commands: queue.Queue[object] = queue.Queue()
    got: list[GenerationDelta | Exception] = []

    def deliver(request_id: str, item: GenerationDelta | Exception) -> None:
        got.append(item)
        if len(got) == 1:
            commands.put(STOP)  # read at this first token, mid-turn

    tokenizer = ChatTokenizer(REAL_MODEL).tokenizer
    options = EngineOptions(prefix_cache=False)
    owner = OwnerLoop(None, "m", kv_model, tokenizer, options, set(), deliver, _ignore, _ignore)
    commands.put(AddRequest("a", prompts[0], SamplingSettings(max_tokens=200, temperature=0.0)))
    serving = threading.Thread(target=owner.serve, args=(commands,), daemon=True)
    serving.start()
    serving.join(WAIT_S)
    stopped = not serving.is_alive()
    if stopped:
        owner.release()
    assert stopped, "the owner never saw the STOP it read mid-turn"
    assert len(got) < 200


def test_a_request_aborted_during_its_turn_in_the_generator_lane_gets_only_its_abort(
    reference: dict[str, Any],
) -> None:
    """Commands are read at each first token, mid-turn: an adapter request aborted there is
    skipped by the rest of the turn, not stepped without its generator (a "generation failed"
    error after its abort)."""
    import onnxruntime_genai as og

    commands: queue.Queue[object] = queue.Queue()
    got: dict[str, list[GenerationDelta | Exception]] = {"a": [], "b": []}
    prompt = reference["cases"][1]["prompt_ids"]
    greedy = SamplingSettings(max_tokens=3, temperature=0.0)

    def deliver(request_id: str, item: GenerationDelta | Exception) -> None:
        got[request_id].append(item)
        if request_id == "a" and len(got["a"]) == 1:
            commands.put(AbortRequest("b"))  # read before b's step in this turn
        if len(got["a"]) == 3 and got["b"]:
            commands.put(STOP)

    kv = KVModel(ONNX_DIR)
    tokenizer = ChatTokenizer(HF_DIR).tokenizer
    owner = OwnerLoop(og, "m", kv, tokenizer, EngineOptions(), set(), deliver, _ignore, _ignore)
    load = OwnerCall(lambda o: o.generator_lane().load("zen#1", onnx_adapter("zen")), _ignore)
    commands.put(load)
    for name in ("a", "b"):
        commands.put(AddRequest(name, prompt, greedy, adapter="zen#1"))
    owner.serve(commands)
    owner.release()
    assert len(got["b"]) == 1, got["b"]
    assert isinstance(got["b"][0], GenerationDelta) and got["b"][0].finish_reason == "abort"


def _ignore(*counts: object) -> None:
    pass
