"""The one model registry (server/registry.py): every served name, base LLMs and their loaded
LoRA adapters, answered in one place with one unknown-model error. The LLM is the real vLLM
adapter over the fake at vLLM's boundary (encoders are covered through the app's routes)."""

from __future__ import annotations

import pytest

from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import InvalidAdapter
from ferry.llm.vllm import VLLMEngine
from ferry.server.errors import UnknownModel
from ferry.server.registry import ModelEntry, ModelRegistry
from tests.llm.fake_vllm import FakeAsyncLLM, FakeLoRARequest, RequestOutputKind, sampling_params
from tests.llm.llm_paths import ADAPTERS_DIR, HF_DIR, MODEL_NAME

pytestmark = pytest.mark.unit

ZEN = ADAPTERS_DIR / "zen" / "hf"


@pytest.fixture
async def registry() -> ModelRegistry:
    engine = VLLMEngine(
        FakeAsyncLLM(steps=[]),
        ChatTokenizer(HF_DIR),
        name=MODEL_NAME,
        max_context_tokens=256,
        sampling_params_cls=sampling_params,
        delta_output_kind=RequestOutputKind.DELTA,
        lora_request_cls=FakeLoRARequest,
        adapters={"zen": ZEN},
    )
    models = ModelRegistry(llms={MODEL_NAME: engine})
    await models.start()
    return models


async def test_a_base_model_and_its_adapter_resolve_to_one_engine(registry) -> None:
    base, zen = registry.llm(MODEL_NAME), registry.llm("zen")
    assert (base.adapter, base.parent) == (None, None)
    assert (zen.base, zen.adapter, zen.parent) == (MODEL_NAME, "zen", MODEL_NAME)
    assert zen.engine is base.engine
    assert registry.entries() == [
        ModelEntry(MODEL_NAME, "chat"),
        ModelEntry("zen", "chat", parent=MODEL_NAME),
    ]


async def test_an_unknown_name_is_one_error_listing_every_served_model(registry) -> None:
    for lookup in (registry.llm, registry.get):
        with pytest.raises(UnknownModel, match=f"known models: {MODEL_NAME}, zen"):
            lookup("nope")


async def test_adapters_load_under_free_names_on_a_configured_base(registry) -> None:
    with pytest.raises(InvalidAdapter, match="already served"):
        await registry.load_adapter(MODEL_NAME, ZEN, MODEL_NAME)
    with pytest.raises(UnknownModel):
        await registry.load_adapter("calm", ZEN, "no-such-base")
    await registry.load_adapter("calm", ZEN, MODEL_NAME)
    assert registry.llm("calm").adapter == "calm"
    with pytest.raises(InvalidAdapter, match="base model"):
        await registry.unload_adapter(MODEL_NAME)
    await registry.unload_adapter("calm")
    with pytest.raises(UnknownModel):
        registry.llm("calm")


async def test_readiness_follows_the_engines(registry) -> None:
    assert registry.readiness() == {MODEL_NAME: True, "zen": True}
    await registry.close(drain_timeout_s=1)
    assert registry.readiness() == {MODEL_NAME: False, "zen": False}
