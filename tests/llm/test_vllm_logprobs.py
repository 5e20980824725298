"""Log probabilities through VLLMEngine: a fake only at the vLLM boundary (its output shapes), the
adapter and the OpenAI serving layer real, down to the completions/chat response objects."""

from __future__ import annotations

import asyncio

import pytest

from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.vllm import VLLMEngine
from ferry.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from ferry.server.openai.serving import OpenAIServing
from ferry.server.registry import ModelRegistry
from tests.llm.fake_vllm import (
    FakeAsyncLLM,
    Logprob,
    Position,
    RequestOutputKind,
    sampling_params,
)
from tests.llm.llm_paths import HF_DIR, WAIT_S

pytestmark = pytest.mark.unit

TOKENIZER = ChatTokenizer(HF_DIR)
PROMPT = "def add(a, b):"
PROMPT_IDS = TOKENIZER.encode(PROMPT)
GENERATED = TOKENIZER.encode("\n    return")
FIRST, SECOND = TOKENIZER.encode("x")[0], TOKENIZER.encode("y")[0]  # the likeliest two, always


def position(chosen: int, rank: int = 3) -> Position:
    """vLLM's dict at one position: the top-2 by rank, plus the chosen token when outside it."""
    candidates = {FIRST: Logprob(-0.5, 1), SECOND: Logprob(-1.5, 2)}
    candidates.setdefault(chosen, Logprob(-0.1 * (chosen % 7) - 3, rank))
    return candidates


def fake_llm() -> FakeAsyncLLM:
    """GENERATED in two outputs, with logprobs when the params ask for them."""
    half = len(GENERATED) // 2
    steps = [
        (TOKENIZER.decode(GENERATED[:half]), GENERATED[:half]),
        (TOKENIZER.decode(GENERATED)[len(TOKENIZER.decode(GENERATED[:half])) :], GENERATED[half:]),
    ]
    return FakeAsyncLLM(steps=steps, position=position, prompt_position=lambda t: position(t, 5))


def serving(fake: FakeAsyncLLM) -> OpenAIServing:
    engine = VLLMEngine(
        fake,
        TOKENIZER,
        name="tiny-llm",
        max_context_tokens=2048,
        sampling_params_cls=sampling_params,
        delta_output_kind=RequestOutputKind.DELTA,
    )
    return OpenAIServing(ModelRegistry(llms={"tiny-llm": engine}))


async def test_completion_echo_lists_prompt_then_generated_tokens() -> None:
    fake = fake_llm()
    request = CompletionRequest(
        model="tiny-llm", prompt=PROMPT_IDS, max_tokens=len(GENERATED), logprobs=2, echo=True
    )
    response = await asyncio.wait_for(serving(fake).completion(request), WAIT_S)
    assert fake.calls[0][1]["logprobs"] == 2 and fake.calls[0][1]["prompt_logprobs"] == 2
    choice = response.choices[0]
    assert choice.text == TOKENIZER.decode(PROMPT_IDS) + TOKENIZER.decode(GENERATED)
    lp = choice.logprobs
    assert lp.tokens == [TOKENIZER.decode([t]) for t in PROMPT_IDS + GENERATED]
    expected = [position(t, 0)[t].logprob for t in PROMPT_IDS[1:] + GENERATED]
    assert lp.token_logprobs == [None, *expected]
    assert lp.top_logprobs[0] is None
    # The top 2 by rank, keyed by their text; the chosen token only when among them.
    top = {"x": -0.5, "y": -1.5}
    assert all(t == top for t in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])


async def test_chat_logprobs_without_alternatives() -> None:
    fake = fake_llm()
    request = ChatCompletionRequest(
        model="tiny-llm",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=len(GENERATED),
        logprobs=True,
    )
    response = await asyncio.wait_for(serving(fake).chat(request), WAIT_S)
    assert fake.calls[0][1]["logprobs"] == 0 and fake.calls[0][1]["prompt_logprobs"] is None
    content = response.choices[0].logprobs.content
    assert [c.token for c in content] == [TOKENIZER.decode([t]) for t in GENERATED]
    assert [c.logprob for c in content] == [position(t, 0)[t].logprob for t in GENERATED]
    assert all(c.top_logprobs == [] for c in content)


async def test_no_logprobs_unless_asked() -> None:
    fake = fake_llm()
    request = CompletionRequest(model="tiny-llm", prompt=PROMPT, max_tokens=3)
    response = await asyncio.wait_for(serving(fake).completion(request), WAIT_S)
    assert fake.calls[0][1]["logprobs"] is None and response.choices[0].logprobs is None
