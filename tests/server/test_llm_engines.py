"""[[llm_models]] settings reach the engine: role injection stays off unless allowed, the prefix
cache follows its switch."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ferry.bench.server_process import TINY_LLM, TINY_LLM_DIR
from ferry.llm.base import SamplingSettings
from ferry.server.llm_engines import build_llm_engine
from ferry.server.settings import LLMSettings
from tests.llm.test_chat_tokenizer import INJECTION, control_ids

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("allowed", "turn_starts"), [(False, 2), (True, 3)])
def test_special_tokens_in_content_follow_the_model_config(allowed, turn_starts):
    settings = LLMSettings(name=TINY_LLM, path=TINY_LLM_DIR, special_tokens_in_content=allowed)
    engine = build_llm_engine(settings)
    chat = engine.tokenizer
    ids = chat.encode_chat([{"role": "user", "content": INJECTION}])
    # The template opens two turns (user, assistant); a third comes only from the content.
    assert ids.count(control_ids(chat)["<|im_start|>"]) == turn_starts


@pytest.mark.parametrize(("switch", "reused"), [(True, True), (False, False)])
async def test_the_prefix_cache_switch_reaches_the_engine(switch, reused):
    settings = LLMSettings(name=TINY_LLM, path=TINY_LLM_DIR, prefix_cache=switch)
    engine = build_llm_engine(settings)
    await engine.start()
    try:
        prompt = engine.tokenizer.encode("def fibonacci(n):")
        sampling = SamplingSettings(max_tokens=2, temperature=0)
        for request_id in ("first", "second"):
            deltas = [d async for d in engine.generate(request_id, prompt, sampling)]
        assert (deltas[0].cached_tokens > 0) is reused
        assert (engine.stats().prefix_cache_hits > 0) is reused
    finally:
        await engine.close()


def test_a_one_token_prefill_chunk_is_refused():
    with pytest.raises(ValidationError, match="prefill_chunk"):
        LLMSettings(name=TINY_LLM, path=TINY_LLM_DIR, prefill_chunk=1)


@pytest.mark.parametrize("switch", [True, False])
def test_batch_invariant_makes_the_ortgenai_engine_deterministic(switch):
    settings = LLMSettings(name=TINY_LLM, path=TINY_LLM_DIR, batch_invariant=switch)
    assert build_llm_engine(settings).deterministic is switch


@pytest.mark.parametrize(("fields", "spec_tokens"), [({}, 0), ({"spec_tokens": 6}, 6)])
def test_speculation_reaches_the_ortgenai_engine_off_by_default(fields, spec_tokens):
    settings = LLMSettings(name=TINY_LLM, path=TINY_LLM_DIR, **fields)
    assert build_llm_engine(settings).spec_tokens == spec_tokens


def test_spin_us_reaches_the_ortgenai_engine():
    # Refused for vllm: tests/server/test_llm_settings.py, with every other engine option.
    settings = LLMSettings(name=TINY_LLM, path=TINY_LLM_DIR, spin_us=200)
    assert build_llm_engine(settings).spin_us == 200
