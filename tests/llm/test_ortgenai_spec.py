"""N-gram speculation on the batch lane (ortgenai_batch.py `_verify`), on the committed tiny model,
whose float32 kernels round a checking pass as they round a decode step: on a prompt that quotes
itself, the tokens with speculation are the tokens without it, greedy, sampled with a seed,
under a grammar, with a stop string and logprobs through the engine; and drafts were accepted."""

from __future__ import annotations

import asyncio

import pytest

from ferry.llm.base import EngineStats, GenerationDelta, Guidance, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.ortgenai import OrtGenAIEngine
from ferry.llm.ortgenai_batch import BatchLane
from ferry.llm.ortgenai_kv import KVModel
from ferry.llm.ortgenai_owner import AddRequest, Job
from ferry.llm.stops import StopMatcher
from tests.llm.llm_paths import ONNX_DIR, WAIT_S

pytestmark = pytest.mark.unit

EOS = {2}
QUOTING = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\ndef fibonacci(n):\n"
)


@pytest.fixture(scope="module")
def tiny() -> KVModel:
    return KVModel(ONNX_DIR)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return ChatTokenizer(ONNX_DIR).encode(QUOTING)


def tokens(lane: BatchLane, prompt: list[int], sampling: SamplingSettings) -> list[int]:
    request = Job(AddRequest("r", prompt, sampling), StopMatcher(()))
    lane.begin(request, None, prompt, sampling)
    out: list[int] = []
    while lane.jobs:
        for job, token, finish, error in lane.step():
            assert error is None
            if token is not None:
                job.generated += 1
                out.append(token)
            if finish is not None:
                lane.remove(job)
    return out


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingSettings(max_tokens=61, temperature=0.0),
        SamplingSettings(max_tokens=48, temperature=0.3, seed=5, ignore_eos=True),
        SamplingSettings(max_tokens=40, temperature=0.0, repetition_penalty=1.05),
        SamplingSettings(
            max_tokens=40, temperature=0.0, guidance=Guidance("regex", "(    return a\n){2,9}")
        ),
    ],
    ids=["greedy", "sampled", "penalty", "grammar"],
)
def test_speculation_gives_the_tokens_decoding_gives(tiny, prompt, sampling):
    plain = tokens(BatchLane(tiny, 4, EOS), prompt, sampling)
    lane = BatchLane(tiny, 4, EOS, spec_tokens=6)
    assert tokens(lane, prompt, sampling) == plain
    assert lane.accepted > 0  # drafts were taken, not only tried
    assert len(plain) == sampling.max_tokens or sampling.guidance is not None


async def test_a_stop_string_and_logprobs_come_out_as_without_speculation(prompt):
    sampling = SamplingSettings(max_tokens=64, temperature=0.0, logprobs=2, stop=("ahi, ahi",))

    async def served(spec_tokens: int) -> tuple[list[GenerationDelta], EngineStats]:
        engine = OrtGenAIEngine(ONNX_DIR, name="spec", spec_tokens=spec_tokens)
        await engine.start()
        try:
            run = engine.generate("r", prompt, sampling)
            return await asyncio.wait_for(_all(run), WAIT_S), engine.stats()
        finally:
            await engine.close()

    (plain, off), (speculated, on) = await served(0), await served(6)
    # What the metrics read (ferry_llm_spec_decode_*): none without speculation.
    assert (off.spec_draft_tokens, off.spec_accepted_tokens) == (0, 0)
    assert 0 < on.spec_accepted_tokens <= on.spec_draft_tokens
    assert "".join(d.text for d in speculated) == "".join(d.text for d in plain)
    assert speculated[-1].finish_reason == plain[-1].finish_reason == "stop"
    entries = [[e.token_id for d in run for e in d.logprobs] for run in (plain, speculated)]
    assert entries[0] == entries[1]


async def _all(deltas) -> list[GenerationDelta]:  # type: ignore[no-untyped-def]
    return [d async for d in deltas]
