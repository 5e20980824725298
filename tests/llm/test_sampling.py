"""Token choice in numpy (sampling.py): greedy, og's repetition penalty, nucleus, seeds."""

from __future__ import annotations

import numpy as np

from ferry.llm.base import SamplingSettings
from ferry.llm.logprobs import log_softmax
from ferry.llm.sampling import Sampler

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
