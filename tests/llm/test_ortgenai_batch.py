"""The batch lane (ortgenai_batch.py) on the real SmolLM2-135M int4: rows stay packed as requests
finish, a request joins while others decode and takes its prompt from the prefix cache, in
the deterministic mode every request's greedy tokens are the ones it gets alone, and `echo` gives
the answers the og.Generator lane gave."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import onnxruntime_genai as og
import pytest

from ferry.llm.base import Guidance, SamplingSettings
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.grammar_rows import GrammarCompiler
from ferry.llm.ortgenai_batch import BatchLane, needs_generator
from ferry.llm.ortgenai_kv import KVModel
from ferry.llm.ortgenai_lora import GeneratorLane
from ferry.llm.ortgenai_owner import AddRequest, Job
from ferry.llm.ortgenai_prefix import ModelPrefixCache, PrefixCache
from ferry.llm.stops import StopMatcher
from tests.llm.llm_paths import REAL_MODEL

pytestmark = pytest.mark.unit

EOS = {2}


def job(name: str, prompt: list[int], max_tokens: int, guidance: Guidance | None = None) -> Job:
    sampling = SamplingSettings(max_tokens=max_tokens, temperature=0.0, guidance=guidance)
    return Job(AddRequest(name, prompt, sampling), StopMatcher(()))


def turn(lane: BatchLane, out: dict[str, list[int]]) -> None:
    """One lane step, with what the owner loop does with its results."""
    for j, token, finish, error in lane.step():
        assert error is None
        if token is not None:
            j.generated += 1
            out.setdefault(j.add.request_id, []).append(token)
        if finish is not None:
            lane.remove(j)


def run(lane: BatchLane, jobs: list[Job]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for j in jobs:
        lane.begin(j, None, j.add.prompt_ids, j.add.sampling)
    while lane.jobs:
        turn(lane, out)
    return out


def alone(model: KVModel, prompt: list[int], max_tokens: int) -> list[int]:
    lane = BatchLane(model, 4, EOS, deterministic=True)
    return run(lane, [job("solo", prompt, max_tokens)])["solo"]


def test_a_finished_row_is_refilled_and_the_others_decode_on_unchanged(kv_model, prompts):
    lane = BatchLane(kv_model, 4, EOS, deterministic=True)
    jobs = [job("a", prompts[0], 2), job("b", prompts[1], 8), job("c", prompts[2], 8)]
    out = run(lane, jobs)  # "a" ends first: the last row ("c") moves into its place
    assert len(out["a"]) == 2 and len(out["b"]) == len(out["c"]) == 8
    assert out["b"] == alone(kv_model, prompts[1], 8)
    assert out["c"] == alone(kv_model, prompts[2], 8)
    assert lane._block is not None  # idle: the decode block is kept for the next requests
    lane.release()
    assert lane._block is None


def test_a_request_joins_while_another_decodes_and_reuses_its_prompt(kv_model, prompts):
    cache = ModelPrefixCache(PrefixCache(2**30), "m", kv_model.token_bytes)
    lane = BatchLane(kv_model, 4, EOS, cache=cache, prefill_chunk=8, deterministic=True)
    first = job("first", prompts[0], 8)
    lane.begin(first, None, prompts[0], first.add.sampling)
    out: dict[str, list[int]] = {}
    while len(out.get("first", [])) < 3:
        turn(lane, out)
    late = job("late", prompts[0], 8)
    lane.begin(late, None, prompts[0], late.add.sampling)
    assert late.cached_tokens == len(prompts[0])  # the whole prompt, its last logits too
    turn(lane, out)
    # Its first token from its prompt, its second from the decode step it shares with "first".
    assert len(out["late"]) == 2 and len(out["first"]) == 4
    while lane.jobs:
        turn(lane, out)
    assert out["late"] == out["first"] == alone(kv_model, prompts[0], 8)


def test_cached_prompts_joining_a_decode_run_their_tails_as_a_lone_request_does(kv_model, prompts):
    """A hit leaves the prompt's last two tokens to a prompt piece whether the request runs alone
    or joins rows already decoding, so its text does not depend on what else runs (as a decode
    row at once, its last prompt token rounded as a decode step's, and greedy text parted from
    the lone request's at near ties: bench.llm_peer, 4-6 of 8 the same at 1, 4 and 8 streams).
    The prompts end in a token the cached ones do not: a whole repeat runs no tail at all."""
    cache = ModelPrefixCache(PrefixCache(2**30), "m", kv_model.token_bytes)
    lane = BatchLane(kv_model, 4, EOS, cache=cache)
    run(lane, [job(f"cached {i}", p, 8) for i, p in enumerate(prompts[:3])])
    burst = [[*p[:-1], p[-1] + 1] for p in prompts[:3]]
    lone = job("lone", [*prompts[0][:-1], prompts[0][-1] + 2], 8)
    fresh = [job(str(i), p, 8) for i, p in enumerate(burst)] + [job("lone", lone.add.prompt_ids, 8)]
    computed = run(BatchLane(kv_model, 4, EOS), fresh)
    lane.begin(lone, None, lone.add.prompt_ids, lone.add.sampling)
    out: dict[str, list[int]] = {}
    turn(lane, out)  # its prompt's tail, then its first decode step
    jobs = [job(str(i), p, 8) for i, p in enumerate(burst)]
    for j in jobs:
        lane.begin(j, None, j.add.prompt_ids, j.add.sampling)
    assert lane._rows == [lone] and lane._prefilling == jobs
    assert [j.cached_tokens for j in jobs] == [len(p) - 2 for p in burst]
    while lane.jobs:
        turn(lane, out)
    assert lone.cached_tokens == len(lone.add.prompt_ids) - 2
    assert out == computed
    lane.release()


@pytest.mark.parametrize("seed", [None, 7], ids=["greedy", "seeded"])
def test_a_prompt_sent_again_whole_runs_no_forward_pass_and_answers_the_same(
    kv_model, prompts, seed
):
    """Its last position's logits are kept with its keys and values (ortgenai_prefix.py): the
    repeat's first token is chosen from them, and its text is the first run's, greedy or
    sampled with the same seed."""
    forwards: list[int] = []
    cache = ModelPrefixCache(PrefixCache(2**30), "m", kv_model.token_bytes)
    lane = BatchLane(kv_model, 4, EOS, cache=cache, before_forward=lambda: forwards.append(1))
    sampling = SamplingSettings(max_tokens=8, temperature=0.0 if seed is None else 1.0, seed=seed)
    first, again = (Job(AddRequest(n, prompts[0], sampling), StopMatcher(())) for n in "ab")
    answers = run(lane, [first])
    lane.begin(again, None, prompts[0], sampling)
    assert again.cached_tokens == len(prompts[0])
    forwards.clear()
    turn(lane, answers)  # its first token from the kept logits, its second from a decode step
    assert len(answers["b"]) == 2 and len(forwards) == 1
    while lane.jobs:
        turn(lane, answers)
    assert answers["b"] == answers["a"]
    lane.release()


def test_requests_joining_one_a_turn_decode_in_one_decode_block(kv_model, prompts, monkeypatch):
    """The decode block made when the first request joins has a row for every request that may
    run: the others, joining on later turns, never regrow it (each growth copied every row
    while all of them waited)."""
    lane = BatchLane(kv_model, 8, EOS)
    made = []  # decode blocks (prompt blocks are made unmapped, one per request)
    new_block = kv_model.new_block

    def counted(rows: int, length: int, mapped: bool = False) -> Any:
        if mapped:
            made.append(rows)
        return new_block(rows, length, mapped=mapped)

    monkeypatch.setattr(kv_model, "new_block", counted)
    out: dict[str, list[int]] = {}
    rows = []
    for index in range(5):
        request = job(str(index), prompts[index % len(prompts)], 8)
        lane.begin(request, None, request.add.prompt_ids, request.add.sampling)
        turn(lane, out)
        rows.append(len(lane._rows))
    assert max(rows) > 2  # past two rows the block used to double
    assert made == [8]
    lane.release()


def test_only_adapters_need_a_generator():
    plain = SamplingSettings()
    assert not needs_generator(None, plain)
    assert not needs_generator(None, SamplingSettings(logprobs=2, seed=3, temperature=0.7))
    assert not needs_generator(None, SamplingSettings(echo=True, logprobs=5))
    assert needs_generator("zen", plain)


def test_a_constrained_row_decodes_in_the_same_step_as_free_ones(kv_model, prompts):
    """One forward pass per turn serves both; the grammar holds its own row only."""
    lane = BatchLane(kv_model, 4, EOS, deterministic=True)
    digits = job("digits", prompts[0], 12, Guidance("regex", "[0-9]{6}"))
    free = job("free", prompts[1], 8)
    for j in (digits, free):
        lane.begin(j, None, j.add.prompt_ids, j.add.sampling)
    out: dict[str, list[int]] = {}
    turn(lane, out)  # both prompts in (a first token each), then one decode step for both
    assert lane._rows == [digits, free] and len(out["digits"]) == len(out["free"]) == 2
    turn(lane, out)  # one decode step: a token for each row
    assert len(out["digits"]) == len(out["free"]) == 3
    while lane.jobs:
        turn(lane, out)
    assert re.fullmatch("[0-9]{6}", ChatTokenizer(REAL_MODEL).decode(out["digits"]))
    assert out["free"] == alone(kv_model, prompts[1], 8)


def test_a_grammar_alone_needs_no_generator():
    assert not needs_generator(None, SamplingSettings(guidance=Guidance("regex", "[a-z]+")))
    assert needs_generator("zen", SamplingSettings(guidance=Guidance("regex", "[a-z]+")))


@pytest.fixture(scope="module")
def generator_lane() -> Iterator[GeneratorLane]:
    """The og.Generator lane on an og.Model of its own: where `echo` was served before."""
    grammars = GrammarCompiler(REAL_MODEL)
    lane = GeneratorLane(og, og.Model(str(REAL_MODEL)), EOS, grammars)
    yield lane
    lane.release()
    grammars.close()


def served(lane: Any, request: Job) -> tuple[Any, list[int], list[Any]]:
    """`request` run alone on `lane`: its echoed prompt entries, new tokens and their entries."""
    lane.begin(request, None, request.add.prompt_ids, request.add.sampling)
    echoed, tokens, entries = None, [], []
    while lane.jobs:
        for j, token, finish, error in lane.step():
            assert error is None
            echoed = echoed or j.prompt_logprobs
            entries.append(j.logprob)
            if token is not None:
                j.generated += 1
                tokens.append(token)
            if finish is not None:
                lane.remove(j)
    return echoed, tokens, entries


def same_entries(got: Any, expected: Any) -> None:
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        if theirs is None:
            assert mine is None
            continue
        assert mine.token_id == theirs.token_id
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-5)
        assert [t for t, _ in mine.top] == [t for t, _ in theirs.top]
        assert [lp for _, lp in mine.top] == pytest.approx([lp for _, lp in theirs.top], abs=1e-5)


@pytest.mark.parametrize(
    ("question", "chunk", "settings"),
    [
        # A prompt in pieces of 8: each piece's forward scores its own positions.
        ("What is the capital of France?", 8, {"max_tokens": 6, "logprobs": 3}),
        # The penalty (test_default_llm holds the batch lane's to og's own): equal here too.
        ("Write a poem about dreams.", 0, {"max_tokens": 32, "repetition_penalty": 1.3}),
    ],
)
def test_echo_on_the_batch_lane_answers_as_the_generator_lane_did(
    kv_model, generator_lane, question, chunk, settings
):
    prompt = ChatTokenizer(REAL_MODEL).encode_chat([{"role": "user", "content": question}])
    sampling = SamplingSettings(temperature=0.0, echo=True, **settings)
    before = served(generator_lane, Job(AddRequest("og", prompt, sampling), StopMatcher(())))
    cache = ModelPrefixCache(PrefixCache(2**30), "m", kv_model.token_bytes)
    lane = BatchLane(kv_model, 4, EOS, cache=cache, prefill_chunk=chunk)
    served(lane, job("warm", prompt, 2))  # a cached prompt must not stand in for echo's scores
    request = Job(AddRequest("batch", prompt, sampling), StopMatcher(()))
    echoed, tokens, entries = served(lane, request)
    assert request.cached_tokens == 0
    assert len(echoed) == len(prompt) and [e.token_id for e in echoed[1:]] == prompt[1:]
    same_entries(echoed, before[0])
    assert tokens == before[1]
    same_entries(entries, before[2])
