"""Log probabilities on the real tiny model through OrtGenAIEngine (its batch lane)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from ferry.llm.base import GenerationDelta, SamplingSettings
from ferry.llm.ortgenai import OrtGenAIEngine
from tests.llm.llm_paths import WAIT_S

pytestmark = pytest.mark.unit

STEPS = 12


async def run(
    engine: OrtGenAIEngine, ids: list[int], sampling: SamplingSettings
) -> list[GenerationDelta]:
    async def collect() -> list[GenerationDelta]:
        return [d async for d in engine.generate("scored", ids, sampling)]

    return await asyncio.wait_for(collect(), WAIT_S)


async def test_greedy_logprobs_follow_the_reference(
    engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    case = reference["cases"][0]
    sampling = SamplingSettings(max_tokens=STEPS, temperature=0.0, logprobs=3)
    deltas = await run(engine, case["prompt_ids"], sampling)
    entries = [e for d in deltas for e in d.logprobs]
    # The same tokens as the plain engine path (the committed greedy reference).
    assert [e.token_id for e in entries] == case["new_ids"][:STEPS]
    assert "".join(d.text for d in deltas) == engine.tokenizer.decode(case["new_ids"][:STEPS])
    assert deltas[-1].finish_reason == "length"
    for entry in entries:
        assert len(entry.top) == 3
        assert entry.top[0] == (entry.token_id, entry.logprob)  # greedy takes the likeliest
        assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)
        assert entry.logprob <= 0 and sum(math.exp(lp) for _, lp in entry.top) <= 1 + 1e-9


async def test_echo_scores_the_prompt_as_generation_scored_it(
    engine: OrtGenAIEngine, reference: dict[str, Any]
) -> None:
    case = reference["cases"][0]
    greedy = SamplingSettings(max_tokens=STEPS, temperature=0.0, logprobs=0)
    generated = [e for d in await run(engine, case["prompt_ids"], greedy) for e in d.logprobs]
    # The prompt + that continuation, scored in one prefill: its last positions must give the
    # log probabilities the step-by-step decode gave.
    prompt = case["prompt_ids"] + case["new_ids"][:STEPS]
    echo = SamplingSettings(max_tokens=1, temperature=0.0, logprobs=1, echo=True)
    deltas = await run(engine, prompt, echo)
    echoed = deltas[0].prompt_logprobs
    assert echoed is not None and len(echoed) == len(prompt) and echoed[0] is None
    assert [e.token_id for e in echoed[1:]] == prompt[1:]
    tail = [e.logprob for e in echoed[-STEPS:]]
    assert tail == pytest.approx([e.logprob for e in generated], abs=1e-4)
    assert all(len(e.top) == 1 for e in echoed[1:])


async def test_plain_requests_still_run_on_the_engine_api(engine: OrtGenAIEngine) -> None:
    deltas = await run(engine, [5, 6, 7], SamplingSettings(max_tokens=3, temperature=0.0))
    assert all(d.logprobs == () and d.prompt_logprobs is None for d in deltas)


@pytest.mark.parametrize("seed", [2**42 + 1, -1])
async def test_any_int64_seed_is_taken_and_repeats_its_sample(
    engine: OrtGenAIEngine, reference: dict[str, Any], seed: int
) -> None:
    # The scored path's runtime takes a C int; OpenAI's seed is any int64 (the fuzzer's 2**42+1
    # was a 500).
    prompt = reference["cases"][0]["prompt_ids"]
    sampling = SamplingSettings(max_tokens=STEPS, temperature=1.5, logprobs=1, seed=seed)
    first, second = [await run(engine, prompt, sampling) for _ in range(2)]
    assert [e.token_id for d in first for e in d.logprobs] == [
        e.token_id for d in second for e in d.logprobs
    ]
