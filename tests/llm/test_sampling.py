"""Token choice in numpy (sampling.py): greedy, og's repetition penalty, nucleus, seeds."""

from __future__ import annotations

import numpy as np
import pytest

from ferry.llm.base import SamplingSettings
from ferry.llm.logprobs import log_softmax
from ferry.llm.sampling import Sampler, end_ids

pytestmark = pytest.mark.unit

GREEDY = SamplingSettings(temperature=0.0)


def test_greedy_takes_the_first_of_equal_maxima():
    assert Sampler(GREEDY, []).choose(np.array([0.0, 3.0, 3.0, 1.0], np.float32))[0] == 1


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    sampling = SamplingSettings(temperature=0.0, repetition_penalty=2.0)
    sampler = Sampler(sampling, prompt_ids=[0])
    assert sampler.choose(np.array([3.0, 2.0, -1.0], np.float32))[0] == 1  # 3 / 2 < 2
    # 1 is seen now too (chosen): 1.5 / 2 = 0.75 and 2.0 / 2 = 1.0.
    assert sampler.choose(np.array([1.5, 2.0, -1.0], np.float32))[0] == 1
    negative = Sampler(sampling, prompt_ids=[0, 1])
    assert negative.choose(np.array([-0.6, -0.2, -1.0], np.float32))[0] == 1  # -0.4 > -1.0, -1.2


def test_logprobs_are_the_models_before_the_penalty():
    logits = np.array([3.0, 2.0, -1.0], np.float32)
    sampling = SamplingSettings(temperature=0.0, repetition_penalty=2.0, logprobs=2)
    token, entry = Sampler(sampling, prompt_ids=[0]).choose(logits)
    assert token == 1 and entry is not None
    assert entry.logprob == float(log_softmax(logits)[1])
    assert [t for t, _ in entry.top] == [0, 1]


def test_a_small_nucleus_keeps_only_the_likeliest_token():
    logits = np.log(np.array([0.1, 0.6, 0.3], np.float32))
    sampler = Sampler(SamplingSettings(temperature=1.0, top_p=0.5), [])
    assert {sampler.choose(logits)[0] for _ in range(50)} == {1}
    wide = Sampler(SamplingSettings(temperature=1.0, top_p=0.95), [])
    assert {wide.choose(logits)[0] for _ in range(200)} == {0, 1, 2}


def test_a_seed_repeats_its_tokens_and_any_int64_seed_is_taken():
    logits = np.zeros(50, np.float32)
    for seed in (7, -1, 2**63 - 1):
        runs = [Sampler(SamplingSettings(seed=seed), []) for _ in range(2)]
        assert [runs[0].choose(logits)[0] for _ in range(20)] == [
            runs[1].choose(logits)[0] for _ in range(20)
        ]


def test_the_smallest_float32_penalty_overflows_nothing():
    """A penalty at float32's smallest normal (the OpenAPI fuzzer's boundary value) sends a
    seen token's positive logit past float32's range; sampling must still pick a real token."""
    tiny = float(np.finfo(np.float32).tiny)
    sampler = Sampler(SamplingSettings(temperature=1.0, repetition_penalty=tiny), [0, 1])
    assert sampler.choose(np.array([5.0, 4.0, -1.0], np.float32))[0] == 0  # 5 / tiny wins


def test_a_grammar_mask_leaves_only_allowed_tokens_and_the_models_logprobs():
    logits = np.log(np.array([0.5, 0.2, 0.2, 0.1], np.float32))
    allowed = np.array([False, True, False, True])
    sampled = Sampler(SamplingSettings(temperature=1.0, seed=7, logprobs=0), [])
    assert {sampled.choose(logits, allowed)[0] for _ in range(50)} == {1, 3}
    token, entry = Sampler(SamplingSettings(temperature=0.0, logprobs=0), []).choose(
        logits, allowed
    )
    assert token == 1 and entry is not None and entry.logprob == float(log_softmax(logits)[1])


# vLLM's extensions (sampling.restricted): masks on the scores, greedy or sampled.
def test_top_k_one_samples_only_the_likeliest_token_at_any_temperature():
    logits = np.log(np.array([0.3, 0.4, 0.3], np.float32))
    sampler = Sampler(SamplingSettings(temperature=2.0, top_k=1, seed=0), [])
    assert {sampler.choose(logits)[0] for _ in range(50)} == {1}


def test_top_k_keeps_exactly_k_tokens():
    logits = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
    sampler = Sampler(SamplingSettings(temperature=1.0, top_k=2, seed=0), [])
    assert {sampler.choose(logits)[0] for _ in range(200)} == {2, 3}


def test_min_p_drops_tokens_under_its_share_of_the_likeliest():
    # At temperature 1: 0.05 < 0.2 * 0.5 is dropped, 0.15 and 0.3 are kept.
    logits = np.log(np.array([0.05, 0.15, 0.3, 0.5], np.float32))
    sampler = Sampler(SamplingSettings(temperature=1.0, min_p=0.2, seed=0), [])
    assert {sampler.choose(logits)[0] for _ in range(300)} == {1, 2, 3}


def test_the_end_is_banned_before_min_tokens_and_under_ignore_eos():
    logits = np.array([5.0, 1.0, 0.0], np.float32)  # token 0 ends: the likeliest
    ends = frozenset({0})
    late = Sampler(SamplingSettings(temperature=0.0, min_tokens=2), [], ends)
    assert [late.choose(logits)[0] for _ in range(3)] == [1, 1, 0]
    never = Sampler(SamplingSettings(temperature=0.0, ignore_eos=True), [], ends)
    assert {never.choose(logits)[0] for _ in range(5)} == {1}


def test_ignore_eos_still_ends_at_a_requested_stop_token():
    sampling = SamplingSettings(temperature=0.0, ignore_eos=True, stop_token_ids=(2,))
    sampler = Sampler(sampling, [], end_ids({0}, sampling))
    assert sampler.choose(np.array([5.0, 1.0, 3.0], np.float32))[0] == 2
