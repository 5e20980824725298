"""Log probabilities through VLLMEngine: a fake only at the vLLM boundary (its output shapes), the
adapter and the OpenAI serving layer real, down to the completions/chat response objects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.vllm import VLLMEngine
from ferry.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from ferry.server.openai.serving import OpenAIServing
from tests.llm.llm_paths import HF_DIR, WAIT_S

TOKENIZER = ChatTokenizer(HF_DIR)
PROMPT = "def add(a, b):"
PROMPT_IDS = TOKENIZER.encode(PROMPT)
GENERATED = TOKENIZER.encode("\n    return")
FIRST, SECOND = TOKENIZER.encode("x")[0], TOKENIZER.encode("y")[0]  # the likeliest two, always


@dataclass
class Logprob:  # shaped like vllm.sequence.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def position(chosen: int, rank: int) -> dict[int, Logprob]:
    """vLLM's dict at one position: the top-2 by rank, plus the chosen token when outside it."""
    candidates = {FIRST: Logprob(-0.5, 1), SECOND: Logprob(-1.5, 2)}
    candidates.setdefault(chosen, Logprob(-0.1 * (chosen % 7) - 3, rank))
    return candidates


@dataclass
class Completion:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None


@dataclass
class Output:
    request_id: str
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[Completion]
    finished: bool


@dataclass
class FakeAsyncLLM:
    """Two cumulative outputs of GENERATED, with logprobs when the params ask for them."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    async def generate(
        self,
        prompt: Any,
        params: Any,
        request_id: str,
        lora_request: Any = None,
        priority: int = 0,  # AsyncLLM.generate's keyword
    ) -> AsyncIterator[Output]:
        self.calls.append(params)
        ids = prompt["prompt_token_ids"]
        wanted = params["logprobs"] is not None
        echoed = None
        if params["prompt_logprobs"] is not None:
            echoed = [None, *(position(t, 5) for t in ids[1:])]
        half = len(GENERATED) // 2
        for end, last in ((half, False), (len(GENERATED), True)):
            part = GENERATED[:end]
            logprobs = [position(t, 3) for t in part] if wanted else None
            completion = Completion(
                0, TOKENIZER.decode(part), part, logprobs, "length" if last else None
            )
            yield Output(request_id, ids, echoed, [completion], last)

    async def abort(self, request_id: str) -> None:
        pass


def serving(fake: FakeAsyncLLM) -> OpenAIServing:
    engine = VLLMEngine(
        fake,
        TOKENIZER,
        name="tiny-llm",
        max_context_tokens=2048,
        sampling_params_cls=lambda **kw: kw,
    )
    return OpenAIServing({"tiny-llm": engine})


async def test_completion_echo_lists_prompt_then_generated_tokens() -> None:
    fake = FakeAsyncLLM()
    request = CompletionRequest(
        model="tiny-llm", prompt=PROMPT_IDS, max_tokens=len(GENERATED), logprobs=2, echo=True
    )
    response = await asyncio.wait_for(serving(fake).completion(request), WAIT_S)
    assert fake.calls[0]["logprobs"] == 2 and fake.calls[0]["prompt_logprobs"] == 2
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
    fake = FakeAsyncLLM()
    request = ChatCompletionRequest(
        model="tiny-llm",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=len(GENERATED),
        logprobs=True,
    )
    response = await asyncio.wait_for(serving(fake).chat(request), WAIT_S)
    assert fake.calls[0]["logprobs"] == 0 and fake.calls[0]["prompt_logprobs"] is None
    content = response.choices[0].logprobs.content
    assert [c.token for c in content] == [TOKENIZER.decode([t]) for t in GENERATED]
    assert [c.logprob for c in content] == [position(t, 0)[t].logprob for t in GENERATED]
    assert all(c.top_logprobs == [] for c in content)


async def test_no_logprobs_unless_asked() -> None:
    fake = FakeAsyncLLM()
    request = CompletionRequest(model="tiny-llm", prompt=PROMPT, max_tokens=3)
    response = await asyncio.wait_for(serving(fake).completion(request), WAIT_S)
    assert fake.calls[0]["logprobs"] is None and response.choices[0].logprobs is None
