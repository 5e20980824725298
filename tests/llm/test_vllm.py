"""VLLMEngine against a fake at the vLLM boundary only: the adapter code runs for real."""

from __future__ import annotations

import asyncio
import os
import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest

from ferry.llm.base import GenerationDelta, Guidance, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import AdapterNotLoaded, EngineOverloaded, InvalidAdapter, InvalidSampling
from ferry.llm.vllm import VLLMEngine
from ferry.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from ferry.server.openai.serving import OpenAIServing
from ferry.server.registry import ModelRegistry
from ferry.server.tenancy import RunAs
from tests.gpu import requires_gpu
from tests.llm.fake_vllm import (
    FakeAsyncLLM,
    FakeLoRARequest,
    RequestOutputKind,
    sampling_params,
)
from tests.llm.llm_paths import ADAPTERS_DIR, HF_DIR, WAIT_S

pytestmark = pytest.mark.unit


def make_engine(fake: FakeAsyncLLM, **kwargs: Any) -> VLLMEngine:
    return VLLMEngine(
        fake,
        ChatTokenizer(HF_DIR),
        name="tiny-llm",
        max_context_tokens=2048,
        sampling_params_cls=sampling_params,
        delta_output_kind=RequestOutputKind.DELTA,
        **kwargs,
    )


PROMPT_IDS = ChatTokenizer(HF_DIR).encode("hello there")


async def collect(engine: VLLMEngine, sampling: SamplingSettings) -> list[GenerationDelta]:
    async def run() -> list[GenerationDelta]:
        return [d async for d in engine.generate("req-1", PROMPT_IDS, sampling)]

    return await asyncio.wait_for(run(), WAIT_S)


async def test_vllm_is_asked_for_deltas_and_they_pass_through() -> None:
    """As vLLM's own OpenAI server streams: each output holds only what the step added, so a
    long generation costs linear time (cumulative outputs re-sliced every step are quadratic)."""
    fake = FakeAsyncLLM(steps=[("Hel", [1, 2]), ("lo", [3]), ("", [4]), (" world", [5])])
    deltas = await collect(make_engine(fake), SamplingSettings(max_tokens=5))
    assert fake.calls[0][1]["output_kind"] == RequestOutputKind.DELTA
    assert [(d.text, d.token_count) for d in deltas] == [
        ("Hel", 2),
        ("lo", 1),
        ("", 1),
        (" world", 1),
    ]
    assert [d.finish_reason for d in deltas] == [None, None, None, "length"]
    assert fake.aborted == []


async def test_prompt_goes_as_token_ids() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])], finish_reason="stop")
    await collect(make_engine(fake), SamplingSettings())
    prompt, _, request_id = fake.calls[0]
    assert prompt == {"prompt_token_ids": PROMPT_IDS}
    assert request_id == "req-1"


async def test_the_serving_layer_tokenizes_and_fits_max_tokens_to_the_context() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])])
    serving = OpenAIServing(ModelRegistry(llms={"tiny-llm": make_engine(fake)}))
    request = CompletionRequest(model="tiny-llm", prompt="hello there", max_tokens=100_000)
    response = await asyncio.wait_for(serving.completion(request), WAIT_S)
    assert response.choices[0].text == "x"
    prompt, params, _ = fake.calls[0]
    assert prompt == {"prompt_token_ids": PROMPT_IDS}
    assert params.kwargs["max_tokens"] == 2048 - len(PROMPT_IDS)


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_the_request_priority_reaches_vllm_generate(kind) -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])], finish_reason="stop")
    serving = OpenAIServing(ModelRegistry(llms={"tiny-llm": make_engine(fake)}))
    if kind == "chat":
        messages = [{"role": "user", "content": "hi"}]
        chat = ChatCompletionRequest(model="tiny-llm", messages=messages, priority=-10)
        await asyncio.wait_for(serving.chat(chat), WAIT_S)
    else:
        request = CompletionRequest(model="tiny-llm", prompt="hello there", priority=-10)
        await asyncio.wait_for(serving.completion(request), WAIT_S)
    default = CompletionRequest(model="tiny-llm", prompt="hello there")
    await asyncio.wait_for(serving.completion(default), WAIT_S)
    assert fake.priorities == [-10, 0]


async def test_the_tenant_salt_reaches_vllm_as_its_cache_salt() -> None:
    """vLLM mixes `cache_salt` into its first block's hash: no reuse across salts."""
    fake = FakeAsyncLLM(steps=[("x", [7])], finish_reason="stop")
    serving = OpenAIServing(ModelRegistry(llms={"tiny-llm": make_engine(fake)}))
    request = CompletionRequest(model="tiny-llm", prompt="hello there")
    await asyncio.wait_for(serving.completion(request, run_as=RunAs(0, "t")), WAIT_S)
    await asyncio.wait_for(serving.completion(request), WAIT_S)
    assert [call[0] for call in fake.calls] == [
        {"prompt_token_ids": PROMPT_IDS, "cache_salt": "t"},
        {"prompt_token_ids": PROMPT_IDS},
    ]


async def test_sampling_settings_become_sampling_params() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])], finish_reason="stop")
    sampling = SamplingSettings(max_tokens=9, temperature=0.5, top_p=0.8, seed=3, stop=("\n",))
    deltas = await collect(make_engine(fake), sampling)
    assert deltas[-1].finish_reason == "stop"
    params = fake.calls[0][1].kwargs
    assert params == {
        "output_kind": RequestOutputKind.DELTA,
        "n": 1,
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.8,
        "seed": 3,
        "stop": ["\n"],
        "logprobs": None,
        "prompt_logprobs": None,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logit_bias": None,
        "top_k": -1,
        "min_p": 0.0,
        "min_tokens": 0,
        "ignore_eos": False,
        "stop_token_ids": [],
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
    }


async def test_penalties_and_logit_bias_reach_sampling_params() -> None:
    # vLLM honours every one (its OpenAI server passes the same fields to SamplingParams).
    fake = FakeAsyncLLM(steps=[("x", [7])], finish_reason="stop")
    serving = OpenAIServing(ModelRegistry(llms={"tiny-llm": make_engine(fake)}))
    body = {
        "model": "tiny-llm",
        "prompt": "hello there",
        "repetition_penalty": 1.2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "logit_bias": {"5": 10, "9": -100},
        "top_k": 4,
        "min_p": 0.05,
        "min_tokens": 2,
        "ignore_eos": True,
        "stop_token_ids": [3],
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
    }
    await asyncio.wait_for(serving.completion(CompletionRequest.model_validate(body)), WAIT_S)
    params = fake.calls[0][1].kwargs
    assert params["repetition_penalty"] == 1.2
    assert (params["presence_penalty"], params["frequency_penalty"]) == (0.5, -0.5)
    assert params["logit_bias"] == {5: 10.0, 9: -100.0}
    assert (params["top_k"], params["min_p"], params["min_tokens"]) == (4, 0.05, 2)
    assert params["ignore_eos"] and params["include_stop_str_in_output"]
    assert params["stop_token_ids"] == [3] and not params["skip_special_tokens"]


async def test_a_logit_bias_outside_the_vocabulary_is_refused_before_vllm() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])])
    serving = OpenAIServing(ModelRegistry(llms={"tiny-llm": make_engine(fake)}))
    vocab = make_engine(fake).tokenizer.vocab_size
    body = {"model": "tiny-llm", "prompt": "hi", "logit_bias": {str(vocab): 1}}
    with pytest.raises(InvalidSampling, match="outside the vocabulary") as err:
        await serving.completion(CompletionRequest.model_validate(body))
    assert err.value.field == "logit_bias" and fake.calls == []


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
        async for _ in engine.generate("req-1", [1], SamplingSettings()):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_S)
    assert fake.aborted == ["req-1"]
    assert engine.stats().running == 0


async def test_overload_is_checked_before_calling_vllm() -> None:
    fake = FakeAsyncLLM(steps=[("a", [1]), ("b", [2])], hold=asyncio.Event())
    engine = make_engine(fake, max_concurrency=1)
    assert engine.max_concurrent_generations == 1  # what the serving layer plans against
    busy = engine.generate("a", [1], SamplingSettings())
    await asyncio.wait_for(anext(busy), WAIT_S)
    with pytest.raises(EngineOverloaded):
        await anext(engine.generate("b", [1], SamplingSettings()))
    await busy.aclose()
    assert fake.aborted == ["a"]
    assert len(fake.calls) == 1


def lora_engine(fake: FakeAsyncLLM, **kwargs: Any) -> VLLMEngine:
    adapters = {"zen": ADAPTERS_DIR / "zen" / "hf"}
    return make_engine(fake, lora_request_cls=FakeLoRARequest, adapters=adapters, **kwargs)


async def test_configured_adapters_load_at_start_and_ride_on_their_requests() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])])
    engine = lora_engine(fake)
    await engine.start()
    assert engine.adapter_names() == ["zen"]
    await collect(engine, SamplingSettings())  # the base model: no LoRARequest

    async def on_zen() -> list[GenerationDelta]:
        return [
            d async for d in engine.generate("z", PROMPT_IDS, SamplingSettings(), adapter="zen")
        ]

    await asyncio.wait_for(on_zen(), WAIT_S)
    assert fake.loras[0] is None
    assert fake.loras[1] == FakeLoRARequest("zen", 1, str(ADAPTERS_DIR / "zen" / "hf"))
    with pytest.raises(AdapterNotLoaded):
        await anext(engine.generate("s", PROMPT_IDS, SamplingSettings(), adapter="shout"))


async def test_runtime_load_and_an_unload_that_waits_for_requests_in_flight() -> None:
    hold = asyncio.Event()
    fake = FakeAsyncLLM(steps=[("a", [1]), ("b", [2])], hold=hold)
    engine = lora_engine(fake)
    await engine.start()
    await engine.load_adapter("shout", ADAPTERS_DIR / "shout" / "hf")
    stream = engine.generate("s", PROMPT_IDS, SamplingSettings(), adapter="shout")
    await asyncio.wait_for(anext(stream), WAIT_S)
    unload = asyncio.create_task(engine.unload_adapter("shout"))
    await asyncio.sleep(0)
    assert engine.adapter_names() == ["zen"] and not unload.done() and fake.removed == []
    hold.set()
    assert [d.text async for d in stream] == ["b"]  # the request in flight ran to its end
    await asyncio.wait_for(unload, WAIT_S)
    assert fake.removed == [2]  # shout's lora_int_id, removed from vLLM only now


async def test_bad_adapter_loads_are_refused() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])])
    with pytest.raises(InvalidAdapter) as off:
        await make_engine(fake).load_adapter("zen", ADAPTERS_DIR / "zen" / "hf")
    assert off.value.field == "lora_name"  # LoRA is not enabled on this engine
    engine = lora_engine(fake, max_adapters=2)
    await engine.start()
    with pytest.raises(InvalidAdapter) as bad:
        await engine.load_adapter("nothing", ADAPTERS_DIR)  # no adapter_config.json there
    assert bad.value.field == "lora_path"
    assert engine.adapter_names() == ["zen"]
    await engine.load_adapter("shout", ADAPTERS_DIR / "shout" / "hf")  # the failed load freed
    with pytest.raises(InvalidAdapter, match="2 LoRA adapters"):
        await engine.load_adapter("more", ADAPTERS_DIR / "shout" / "hf")


def test_create_vllm_engine_turns_lora_on_from_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm itself is faked at its module boundary; create_vllm_engine runs for real."""
    made: dict[str, Any] = {}

    class AsyncEngineArgs:
        def __init__(self, **kwargs: Any) -> None:
            made.update(kwargs)

    class AsyncLLM:
        model_config = types.SimpleNamespace(max_model_len=512)

        @classmethod
        def from_engine_args(cls, args: AsyncEngineArgs) -> AsyncLLM:
            return cls()

    install_fake_vllm(monkeypatch, AsyncEngineArgs, AsyncLLM)
    from ferry.llm.vllm import create_vllm_engine

    engine = create_vllm_engine(
        HF_DIR, adapters={"zen": ADAPTERS_DIR}, max_adapters=3, max_lora_rank=8
    )
    assert (made["enable_lora"], made["max_loras"], made["max_lora_rank"]) == (True, 3, 8)
    # Priority scheduling, or vLLM refuses a request's non-zero `priority`.
    assert made["scheduling_policy"] == "priority"
    # Ferry's grammars are llguidance's: vLLM's guidance backend runs them.
    assert made["structured_outputs_config"] == {"backend": "guidance"}
    assert engine.max_context_tokens == 512
    assert made["enable_prefix_caching"] is True  # on by default, as in vLLM
    made.clear()
    create_vllm_engine(HF_DIR)
    assert "enable_lora" not in made  # no adapters, no adapter_dir: LoRA stays off


def test_prefix_caching_and_batch_invariance_pass_through_from_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through build_llm_engine from [[llm_models]] settings, up to vllm's own entry points."""
    made: dict[str, Any] = {}
    seen_env: list[str | None] = []

    class AsyncEngineArgs:
        def __init__(self, **kwargs: Any) -> None:
            made.update(kwargs)
            seen_env.append(os.environ.get("VLLM_BATCH_INVARIANT"))

    class AsyncLLM:
        model_config = types.SimpleNamespace(max_model_len=512)

        @classmethod
        def from_engine_args(cls, args: AsyncEngineArgs) -> AsyncLLM:
            return cls()

    install_fake_vllm(monkeypatch, AsyncEngineArgs, AsyncLLM)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    from ferry.server.llm_engines import build_llm_engine
    from ferry.server.settings import LLMSettings

    off = LLMSettings(name="m", engine="vllm", path=HF_DIR, prefix_cache=False)
    build_llm_engine(off)
    assert made["enable_prefix_caching"] is False
    assert seen_env == [None]  # batch invariance off: the environment is left alone
    on = LLMSettings(name="m", engine="vllm", path=HF_DIR, batch_invariant=True)
    build_llm_engine(on)
    assert made["enable_prefix_caching"] is True
    assert seen_env[-1] == "1"  # set before vllm is imported, as vLLM reads it


async def test_cached_prompt_tokens_reach_the_first_delta_and_the_counters() -> None:
    fake = FakeAsyncLLM(steps=[("a", [1]), ("b", [2])], cached=4)
    engine = make_engine(fake)
    deltas = await collect(engine, SamplingSettings(max_tokens=2))
    assert [d.cached_tokens for d in deltas] == [4, None]
    stats = engine.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (len(PROMPT_IDS), 4)
    assert stats.kv_cache_usage is None  # vLLM's scheduler holds it: unreported, not a made-up 0


@pytest.mark.gpu
@requires_gpu
async def test_real_vllm_matches_the_greedy_reference(reference: dict[str, Any]) -> None:
    """Greedy text equals transformers' greedy continuation (models/tiny-llm/greedy_reference.json)
    for every recorded case: the adapter's prompt, sampling and detokenizing are vLLM's real ones.
    float32, as the reference was made: vLLM's `auto` would run a float32 model in float16."""
    # `make test-gpu` installs vllm; `make test-gpu VLLM=` leaves it out, and this test says so.
    pytest.importorskip("vllm", reason="vllm is not installed: pip install '.[vllm]'")
    from ferry.llm.vllm import create_vllm_engine

    engine = create_vllm_engine(HF_DIR, max_model_len=512, enforce_eager=True, dtype="float32")
    try:
        await engine.start()
        sampling = SamplingSettings(max_tokens=reference["max_new_tokens"], temperature=0.0)

        async def run(index: int, case: dict[str, Any]) -> tuple[str, int]:
            stream = engine.generate(f"gpu-{index}", case["prompt_ids"], sampling)
            deltas = [d async for d in stream]
            return "".join(d.text for d in deltas), sum(d.token_count for d in deltas)

        cases = reference["cases"]
        runs = asyncio.gather(*(run(index, case) for index, case in enumerate(cases)))
        got = await asyncio.wait_for(runs, 300)
        for case, (text, tokens) in zip(cases, got, strict=True):
            assert text == engine.tokenizer.decode(case["new_ids"]), case["messages"]
            assert tokens == len(case["new_ids"])
    finally:
        await engine.close()


@pytest.mark.gpu
@requires_gpu
async def test_real_vllm_serves_the_tiny_adapter() -> None:
    from ferry.llm.vllm import create_vllm_engine

    # fp16: vLLM's LoRA kernels take half precision.
    adapters = {"zen": ADAPTERS_DIR / "zen" / "hf"}
    engine = create_vllm_engine(
        HF_DIR, max_model_len=512, enforce_eager=True, dtype="float16", adapters=adapters
    )
    try:
        await engine.start()
        assert engine.adapter_names() == ["zen"]
        prompt_ids = PROMPT_IDS
        sampling = SamplingSettings(max_tokens=8, temperature=0.0)

        async def run(adapter: str | None) -> str:
            deltas = engine.generate(f"gpu-{adapter}", prompt_ids, sampling, adapter=adapter)
            return "".join([d.text async for d in deltas])

        base, zen = await asyncio.wait_for(asyncio.gather(run(None), run("zen")), 300)
        assert base != zen  # the adapter changes the greedy output, as it does under peft
        await engine.unload_adapter("zen")
        assert engine.adapter_names() == []
    finally:
        await engine.close()


@dataclass
class FakeStructuredOutputsParams:  # shaped like vllm.sampling_params.StructuredOutputsParams
    json: Any = None
    regex: str | None = None
    grammar: str | None = None


@pytest.mark.parametrize(
    ("body", "field", "value"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "c",
                        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                    },
                }
            },
            "json",
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "x-guidance": {"whitespace_flexible": False},
            },
        ),
        ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"guided_choice": ["yes", "no"]}, "grammar", 'start: "yes" | "no"'),
    ],
)
async def test_structured_outputs_pass_through_to_vllm(body, field, value) -> None:
    fake = FakeAsyncLLM(steps=[("1", [7])], finish_reason="stop")
    structured = (FakeStructuredOutputsParams, "structured_outputs")
    serving = OpenAIServing(
        ModelRegistry(llms={"tiny-llm": make_engine(fake, structured=structured)})
    )
    request = ChatCompletionRequest.model_validate(
        {"model": "tiny-llm", "messages": [{"role": "user", "content": "hi"}], **body}
    )
    await asyncio.wait_for(serving.chat(request), WAIT_S)
    params = fake.calls[0][1].kwargs["structured_outputs"]
    assert getattr(params, field) == value


async def test_tools_reach_vllm_as_an_llguidance_grammar_and_come_back_as_calls() -> None:
    call = '<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>'
    fake = FakeAsyncLLM(steps=[(call[:20], [1]), (call[20:], [2])], finish_reason="stop")
    structured = (FakeStructuredOutputsParams, "structured_outputs")
    serving = OpenAIServing(
        ModelRegistry(llms={"tiny-llm": make_engine(fake, structured=structured)})
    )
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
    request = ChatCompletionRequest.model_validate(
        {
            "model": "tiny-llm",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [tool],
            "tool_choice": "required",
        }
    )
    response = await asyncio.wait_for(serving.chat(request), WAIT_S)
    grammar = fake.calls[0][1].kwargs["structured_outputs"].grammar
    assert grammar.startswith("start: calls") and "%json" in grammar
    message = response.choices[0].message
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("f", '{"a":1}')
    ]
    assert response.choices[0].finish_reason == "tool_calls"


async def test_a_vllm_without_structured_outputs_refuses_guidance() -> None:
    fake = FakeAsyncLLM(steps=[("x", [7])])
    settings = SamplingSettings(guidance=Guidance("regex", "x"))
    with pytest.raises(InvalidSampling):
        await collect(make_engine(fake), settings)
    assert fake.calls == []


def install_fake_vllm(monkeypatch: pytest.MonkeyPatch, engine_args: type, async_llm: type) -> None:
    """vllm's modules as create_vllm_engine imports them, around the given engine classes."""
    modules = {
        "vllm": types.SimpleNamespace(AsyncEngineArgs=engine_args, SamplingParams=dict),
        "vllm.lora.request": types.SimpleNamespace(LoRARequest=FakeLoRARequest),
        "vllm.v1.engine.async_llm": types.SimpleNamespace(AsyncLLM=async_llm),
        "vllm.sampling_params": types.SimpleNamespace(
            StructuredOutputsParams=FakeStructuredOutputsParams,
            RequestOutputKind=RequestOutputKind,
        ),
        "vllm.config": types.SimpleNamespace(StructuredOutputsConfig=dict),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
