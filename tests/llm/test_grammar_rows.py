"""Grammars on the batch lane (grammar_rows.py), through OrtGenAIEngine on the real tiny model:
a constrained request's greedy text is the one onnxruntime-genai's own guidance gives on an
og.Generator (the lane such requests ran on before), and it reads the prefix cache as a free
request does. That constrained and free rows share one forward pass: test_ortgenai_batch.py."""

from __future__ import annotations

import asyncio
import json

import onnxruntime_genai as og
import pytest

from ferry.llm.base import GenerationDelta, Guidance, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.ortgenai import OrtGenAIEngine
from tests.llm.llm_paths import ONNX_DIR, WAIT_S
from tests.llm.reference_og import eos_ids, greedy

TOKENIZER = ChatTokenizer(ONNX_DIR)
QUESTION = [{"role": "user", "content": "Describe a city in a few words."}]
MAX_TOKENS = 40
CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "people": {"type": "integer"},
        "coastal": {"type": "boolean"},
    },
    "required": ["name", "people", "coastal"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},  # as the serving layer sends it
}
GRAMMARS = [
    Guidance("json_schema", json.dumps(CITY)),
    Guidance("regex", "[a-z]+( [a-z]+){0,4}\\."),
    Guidance("lark_grammar", 'start: "It is " WORD " and " WORD\nWORD: /[a-z]{1,8}/'),
]


@pytest.fixture(scope="module")
def og_model() -> og.Model:
    return og.Model(str(ONNX_DIR))


async def collect(
    engine: OrtGenAIEngine, request_id: str, prompt: list[int], sampling: SamplingSettings
) -> list[GenerationDelta]:
    async def run() -> list[GenerationDelta]:
        return [d async for d in engine.generate(request_id, prompt, sampling)]

    return await asyncio.wait_for(run(), WAIT_S)


@pytest.mark.parametrize("guidance", GRAMMARS, ids=lambda g: g.kind)
async def test_greedy_constrained_text_is_what_og_guidance_gives(
    engine: OrtGenAIEngine, og_model: og.Model, guidance: Guidance
) -> None:
    prompt = TOKENIZER.encode_chat(QUESTION)
    expected, rows = greedy(
        og_model, prompt, MAX_TOKENS, eos_ids(ONNX_DIR), guidance=(guidance.kind, guidance.data)
    )
    sampling = SamplingSettings(
        max_tokens=MAX_TOKENS, temperature=0.0, guidance=guidance, logprobs=0
    )
    deltas = await collect(engine, "g", prompt, sampling)
    assert "".join(d.text for d in deltas) == TOKENIZER.decode(expected)
    assert sum(d.token_count for d in deltas) == len(expected)
    assert deltas[-1].finish_reason == "stop"  # each grammar ends well inside MAX_TOKENS
    # The model's own log probabilities, before the grammar's mask, as og's lane reports them;
    # the end-of-sequence token that closes the answer has one too.
    logprobs = [entry for d in deltas for entry in d.logprobs]
    assert [e.token_id for e in logprobs[:-1]] == expected
    for entry, row in zip(logprobs, rows, strict=False):
        assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=1e-4)


async def test_a_constrained_request_reuses_the_prefix_cache(engine: OrtGenAIEngine) -> None:
    """Only the batch lane reads the prefix cache: a constrained request runs there."""
    prompt = TOKENIZER.encode_chat(QUESTION)
    await collect(engine, "free", prompt, SamplingSettings(max_tokens=2, temperature=0.0))
    sampling = SamplingSettings(max_tokens=8, temperature=0.0, guidance=GRAMMARS[1])
    deltas = await collect(engine, "constrained", prompt, sampling)
    assert deltas[0].cached_tokens == len(prompt) - 2  # the whole prompt but the last two
