"""Grammars masked by Ferry (grammar_rows.py), through OrtGenAIEngine on the real tiny model: a
constrained request's greedy text and log probabilities are the ones onnxruntime-genai's own
guidance gives on an og.Generator (what served grammars before), on the batch lane and on the
generator lane (an adapter), and a constrained request reads the prefix cache as a free one
does. That constrained and free rows share one forward pass: test_ortgenai_batch.py."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace

import onnxruntime_genai as og
import pytest

from ferry.llm.base import GenerationDelta, Guidance, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.grammar_rows import GrammarCompiler
from ferry.llm.ortgenai import OrtGenAIEngine
from tests.llm.llm_paths import ONNX_DIR, WAIT_S, onnx_adapter
from tests.llm.reference_og import eos_ids, greedy

pytestmark = pytest.mark.unit

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


ADAPTER = "zen"


@pytest.fixture(scope="module")
def og_model() -> og.Model:
    return og.Model(str(ONNX_DIR))


@pytest.fixture(scope="module")
def og_adapters(og_model: og.Model) -> og.Adapters:
    adapters = og.Adapters(og_model)
    adapters.load(str(onnx_adapter(ADAPTER)), ADAPTER)
    return adapters


async def collect(
    engine: OrtGenAIEngine,
    request_id: str,
    prompt: list[int],
    sampling: SamplingSettings,
    adapter: str | None = None,
) -> list[GenerationDelta]:
    async def run() -> list[GenerationDelta]:
        return [d async for d in engine.generate(request_id, prompt, sampling, adapter=adapter)]

    return await asyncio.wait_for(run(), WAIT_S)


@pytest.mark.parametrize("adapter", [None, ADAPTER], ids=["batch lane", "generator lane"])
@pytest.mark.parametrize("guidance", GRAMMARS, ids=lambda g: g.kind)
async def test_greedy_constrained_text_is_what_og_guidance_gives(
    engine: OrtGenAIEngine,
    og_model: og.Model,
    og_adapters: og.Adapters,
    guidance: Guidance,
    adapter: str | None,
) -> None:
    """A plain request's grammar masks its batch lane row; an adapter's (on an og.Generator of
    its own) goes onto the generator's logits: both as og's own guidance did."""
    prompt = TOKENIZER.encode_chat(QUESTION)
    expected, rows = greedy(
        og_model,
        prompt,
        MAX_TOKENS,
        eos_ids(ONNX_DIR),
        guidance=(guidance.kind, guidance.data),
        adapter=None if adapter is None else (og_adapters, adapter),
    )
    if adapter is not None:
        await engine.load_adapter(adapter, onnx_adapter(adapter))
    sampling = SamplingSettings(
        max_tokens=MAX_TOKENS, temperature=0.0, guidance=guidance, logprobs=0
    )
    deltas = await collect(engine, "g", prompt, sampling, adapter)
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
    """Only the batch lane reads the prefix cache: a constrained request runs there. Sent
    again whole, it still runs its last two tokens, whose pass hides its grammar's compile."""
    prompt = TOKENIZER.encode_chat(QUESTION)
    await collect(engine, "free", prompt, SamplingSettings(max_tokens=2, temperature=0.0))
    sampling = SamplingSettings(max_tokens=8, temperature=0.0, guidance=GRAMMARS[1])
    deltas = await collect(engine, "constrained", prompt, sampling)
    assert deltas[0].cached_tokens == len(prompt) - 2  # the whole prompt but the last two


WORDS = "[a-z]{1,6}( [a-z]{1,6}){1,3}\\."  # ends within MAX_TOKENS however it is sampled


async def test_a_seeded_constrained_request_repeats_and_keeps_to_its_grammar(
    engine: OrtGenAIEngine,
) -> None:
    prompt = TOKENIZER.encode_chat(QUESTION)
    sampling = SamplingSettings(
        max_tokens=MAX_TOKENS, temperature=1.0, seed=5, guidance=Guidance("regex", WORDS)
    )
    texts = [
        "".join(d.text for d in await collect(engine, f"s{i}", prompt, sampling)) for i in (0, 1)
    ]
    assert texts[0] == texts[1] and re.fullmatch(WORDS, texts[0])
    stopped = replace(sampling, stop=(" ",))  # Ferry's stop strings apply as to free text
    deltas = await collect(engine, "stop", prompt, stopped)
    assert "".join(d.text for d in deltas) == texts[0].split(" ")[0]
    assert deltas[-1].finish_reason == "stop"


def test_a_grammar_sent_again_is_compiled_once_and_each_request_has_its_own_state() -> None:
    compiler = GrammarCompiler(ONNX_DIR)
    try:
        first, again = (compiler.compile(GRAMMARS[2]).result(WAIT_S) for _ in range(2))
        assert compiler.cached == 1
        start = again.allowed(4096)
        for token in TOKENIZER.encode("It is"):
            first.consume(token)
        assert not first.allowed(4096)[TOKENIZER.encode("It")[0]]  # moved on
        assert (again.allowed(4096) == start).all()  # untouched by the other request
    finally:
        compiler.close()
