"""LoRA adapters on OrtGenAIEngine, with the committed tiny adapters on the real runtime."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ferry.llm.base import GenerationDelta, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import AdapterNotLoaded, InvalidAdapter
from ferry.llm.ortgenai import OrtGenAIEngine
from tests.llm.llm_paths import ADAPTER_NAMES, ADAPTERS_DIR, HF_DIR, ONNX_DIR, WAIT_S, onnx_adapter

pytestmark = pytest.mark.unit

TOKENIZER = ChatTokenizer(HF_DIR)
GREEDY = SamplingSettings(max_tokens=20, temperature=0.0)
LONG = SamplingSettings(max_tokens=1500, temperature=0.0)


@pytest.fixture(scope="module")
def adapter_reference() -> dict[str, Any]:
    return json.loads((ADAPTERS_DIR / "greedy_reference.json").read_text())


@pytest.fixture
async def lora_engine() -> AsyncIterator[OrtGenAIEngine]:
    adapters = {name: onnx_adapter(name) for name in ADAPTER_NAMES}
    engine = OrtGenAIEngine(ONNX_DIR, max_running=4, adapters=adapters, max_adapters=3)
    await engine.start()
    yield engine
    await engine.close()


async def generate(
    engine: OrtGenAIEngine,
    request_id: str,
    case: dict[str, Any],
    adapter: str | None,
    sampling: SamplingSettings = GREEDY,
) -> list[GenerationDelta]:
    async def run() -> list[GenerationDelta]:
        deltas = engine.generate(request_id, case["prompt_ids"], sampling, adapter=adapter)
        return [d async for d in deltas]

    return await asyncio.wait_for(run(), WAIT_S)


def ids_of(deltas: list[GenerationDelta]) -> str:
    return "".join(d.text for d in deltas)


def expected(case: dict[str, Any]) -> tuple[str, int, str]:
    """The reference's text, token count and finish reason (it stopped at end-of-sequence)."""
    ids = case["new_ids"]
    return TOKENIZER.decode(ids), len(ids), "length" if len(ids) == 20 else "stop"


async def test_adapter_greedy_output_equals_transformers_and_peft(
    lora_engine: OrtGenAIEngine, adapter_reference: dict[str, Any]
) -> None:
    assert lora_engine.adapter_names() == sorted(ADAPTER_NAMES)
    for name in ADAPTER_NAMES:
        for i, case in enumerate(adapter_reference[name]["cases"]):
            deltas = await generate(lora_engine, f"{name}-{i}", case, name)
            text = ids_of(deltas)
            tokens = sum(d.token_count for d in deltas)
            assert (text, tokens, deltas[-1].finish_reason) == expected(case), (name, i)


async def test_adapters_change_the_output_and_the_base_is_unchanged(
    lora_engine: OrtGenAIEngine, reference: dict[str, Any], adapter_reference: dict[str, Any]
) -> None:
    for i, case in enumerate(reference["cases"]):
        base = ids_of(await generate(lora_engine, f"base-{i}", case, None))
        assert base == TOKENIZER.decode(case["new_ids"])
        for name in ADAPTER_NAMES:
            assert adapter_reference[name]["cases"][i]["new_ids"] != case["new_ids"]


async def test_base_and_two_adapters_interleaved_under_eight_streams(
    lora_engine: OrtGenAIEngine, reference: dict[str, Any], adapter_reference: dict[str, Any]
) -> None:
    plan = [
        (None, reference),
        ("zen", adapter_reference["zen"]),
        ("shout", adapter_reference["shout"]),
    ]
    running_seen: list[int] = []
    waiting_adapters_seen: set[str] = set()  # the inference gateway's waiting_lora_adapters

    async def one(i: int) -> tuple[str, str]:
        adapter, ref = plan[i % 3]
        case = ref["cases"][i % len(ref["cases"])]
        text = ""
        async for delta in lora_engine.generate(
            f"r{i}", case["prompt_ids"], GREEDY, adapter=adapter
        ):
            stats = lora_engine.stats()
            running_seen.append(stats.running)
            waiting_adapters_seen.update(stats.waiting_lora_adapters)
            text += delta.text
        return text, expected(case)[0]

    # Eight requests, four places: the last four wait, three of them on adapters.
    results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(8))), WAIT_S)
    for got, want in results:
        assert got == want
    assert max(running_seen) > 1
    assert waiting_adapters_seen and waiting_adapters_seen <= {"zen", "shout"}
    stats = lora_engine.stats()
    assert stats.running_lora_adapters == ("shout", "zen")  # loaded, by name
    assert stats.waiting_lora_adapters == () and stats.kv_cache_usage == 0


async def test_unload_waits_for_requests_in_flight_then_frees_the_name(
    lora_engine: OrtGenAIEngine, adapter_reference: dict[str, Any]
) -> None:
    case = adapter_reference["zen"]["cases"][0]
    long_run = SamplingSettings(max_tokens=300, temperature=0.0)
    stream = lora_engine.generate("long", case["prompt_ids"], long_run, adapter="zen")
    first = await asyncio.wait_for(anext(stream), WAIT_S)
    unload = asyncio.create_task(lora_engine.unload_adapter("zen"))
    await asyncio.sleep(0)  # the unload has begun: the name is gone for new requests
    assert "zen" not in lora_engine.adapter_names()
    with pytest.raises(AdapterNotLoaded):
        await anext(lora_engine.generate("late", case["prompt_ids"], GREEDY, adapter="zen"))
    assert not unload.done()  # the request in flight is not finished
    deltas, unloaded_meanwhile = [first], []
    async for delta in stream:  # the request in flight runs to its end, the unload waits
        deltas.append(delta)
        unloaded_meanwhile.append(unload.done())
    # A fast engine may hand over everything in the first delta: count tokens, not deltas.
    assert sum(d.token_count for d in deltas) > 1 and deltas[-1].finish_reason is not None
    assert not any(unloaded_meanwhile)
    await asyncio.wait_for(unload, WAIT_S)
    assert deltas[-1].finish_reason in ("length", "stop")
    assert ids_of(deltas).startswith(expected(case)[0])
    # The same name loads again (the runtime got a fresh key), and still gives zen's output.
    await lora_engine.load_adapter("zen", onnx_adapter("zen"))
    again = await generate(lora_engine, "again", case, "zen")
    assert ids_of(again) == expected(case)[0]


async def test_bad_loads_are_refused_and_the_engine_lives_on(
    lora_engine: OrtGenAIEngine, tmp_path: Any, reference: dict[str, Any]
) -> None:
    with pytest.raises(InvalidAdapter) as taken:
        await lora_engine.load_adapter("zen", onnx_adapter("zen"))
    assert taken.value.field == "lora_name"
    broken = tmp_path / "broken.onnx_adapter"
    broken.write_bytes(b"not an adapter")
    with pytest.raises(InvalidAdapter) as bad:
        await lora_engine.load_adapter("broken", broken)
    assert bad.value.field == "lora_path"
    assert "broken" not in lora_engine.adapter_names()
    await lora_engine.load_adapter("zen2", onnx_adapter("zen"))  # the third of max_adapters=3
    with pytest.raises(InvalidAdapter, match="3 LoRA adapters"):
        await lora_engine.load_adapter("zen3", onnx_adapter("zen"))
    with pytest.raises(AdapterNotLoaded):
        await lora_engine.unload_adapter("never-loaded")
    base = await generate(lora_engine, "base", reference["cases"][0], None)
    assert ids_of(base) == TOKENIZER.decode(reference["cases"][0]["new_ids"])


async def test_closing_an_adapter_stream_aborts_it(
    lora_engine: OrtGenAIEngine, adapter_reference: dict[str, Any]
) -> None:
    case = adapter_reference["shout"]["cases"][1]
    stream = lora_engine.generate("r1", case["prompt_ids"], LONG, adapter="shout")
    await asyncio.wait_for(anext(stream), WAIT_S)
    await stream.aclose()

    async def idle() -> None:
        while lora_engine.stats().running or lora_engine.stats().waiting:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(idle(), WAIT_S)
    # Nothing holds the adapter any more: it unloads at once.
    await asyncio.wait_for(lora_engine.unload_adapter("shout"), WAIT_S)


async def test_adapter_and_base_requests_advance_together(
    lora_engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    """Round-robin: neither a base batch nor an adapter request waits for the other to end."""
    case = reference["cases"][0]
    sampling = SamplingSettings(max_tokens=200, temperature=0.0)
    counts = {"base": 0, "shout": 0}
    at_first_finish: dict[str, int] = {}

    async def run(adapter: str | None) -> None:
        name = adapter or "base"
        async for delta in lora_engine.generate(
            name, case["prompt_ids"], sampling, adapter=adapter
        ):
            counts[name] += delta.token_count
        if not at_first_finish:  # the other one's progress when the first one ended
            at_first_finish.update(counts, finished=counts[name])

    await asyncio.wait_for(asyncio.gather(run(None), run("shout")), WAIT_S)
    slower = min(counts, key=lambda n: at_first_finish[n])
    assert at_first_finish[slower] >= at_first_finish["finished"] // 2, at_first_finish
