"""Next-token choice from raw logits in numpy, for the batched CPU lane (ortgenai_batch.py).

The same settings onnxruntime-genai's search takes (ortgenai_lora.search_options): greedy,
temperature with nucleus (top_p; no implicit top-k, OpenAI's semantics), a seed, and its
repetition penalty (Hugging Face's: a positive logit of a token already in the prompt or the
output is divided by the penalty, a negative one multiplied), and a grammar's mask. Greedy is
`argmax`, as og's is: the first of equal maxima. Sampled tokens come from one
`numpy.random.Generator` per request, seeded when the request gives a seed (the same seed gives
the same text; not og's stream).

vLLM's extensions are masks on the scores (`restricted`), which the og.Generator lane applies
through `set_logits` as well: `top_k` and `min_p` (after temperature, as vLLM applies them),
and the end tokens banned before `min_tokens` or always under `ignore_eos`.
"""

from __future__ import annotations

import numpy as np

from ferry.llm.base import SamplingSettings, TokenLogprob
from ferry.llm.logprobs import log_softmax, token_logprob


def end_ids(eos_ids: set[int], sampling: SamplingSettings) -> frozenset[int]:
    """The tokens that end this request: the model's EOS and the request's stop_token_ids."""
    return frozenset(eos_ids).union(sampling.stop_token_ids)


def restricts(sampling: SamplingSettings) -> bool:
    """Whether `restricted` changes anything for this request (most requests: no)."""
    return bool(sampling.ignore_eos or sampling.min_tokens or sampling.top_k or sampling.min_p)


def banned_ids(sampling: SamplingSettings, ends: frozenset[int], generated: int) -> frozenset[int]:
    """The tokens `restricted` rules out by id: the end tokens while fewer than `min_tokens`
    were generated, and always the model's EOS under `ignore_eos` (vLLM's reading)."""
    banned = ends if generated < sampling.min_tokens else frozenset()
    if sampling.ignore_eos:
        banned = banned | (ends - frozenset(sampling.stop_token_ids))
    return banned


def restricted(
    scores: np.ndarray,
    sampling: SamplingSettings,
    ends: frozenset[int],
    generated: int,
    floor: float = -np.inf,
) -> np.ndarray:
    """One position's `scores` with what the request rules out set to `floor`: the end tokens
    while fewer than `min_tokens` were generated (or always, under `ignore_eos`: only the
    model's EOS then, as vLLM's reading), then, when sampling, tokens outside the `top_k`
    likeliest and those under `min_p` times the likeliest's probability at the temperature."""
    banned = banned_ids(sampling, ends, generated)
    if sampling.greedy or not (sampling.top_k or sampling.min_p):
        # Bans only (ignore_eos, min_tokens): a copy with a few entries set, not a mask over
        # the vocabulary (94 -> 27 us a row on a 152k vocabulary, each decode step).
        out = scores.copy()
        if banned:
            out[np.fromiter(banned, dtype=np.int64)] = floor
        return out
    keep = np.ones(scores.shape[-1], dtype=bool)
    if banned:
        keep[np.fromiter(banned, dtype=np.int64)] = False
    live = np.where(keep, scores, -np.inf)  # sampling, with top_k or min_p
    if 0 < sampling.top_k < live.size:
        keep &= live >= np.partition(live, -sampling.top_k)[-sampling.top_k]
    if sampling.min_p > 0.0:
        # p_i >= min_p * p_max  <=>  s_i >= s_max + T * ln(min_p), for p = softmax(s / T)
        keep &= live >= live.max() + sampling.temperature * np.log(sampling.min_p)
    return np.where(keep, scores, floor)


class Sampler:
    """One request's token choice; `seen` holds prompt and output ids for the penalty; `ends`:
    the tokens that end it (end_ids)."""

    def __init__(
        self, sampling: SamplingSettings, prompt_ids: list[int], ends: frozenset[int] = frozenset()
    ) -> None:
        self.sampling = sampling
        self.ends = ends
        self._restricts = restricts(sampling)
        self._generated = 0
        self._penalty = sampling.repetition_penalty
        self._seen = np.zeros(0, dtype=np.int64)
        if self._penalty != 1.0:
            self._seen = np.unique(np.asarray(prompt_ids, dtype=np.int64))
        # OpenAI's seed is any int64; numpy takes non-negative ones: one stream per seed still.
        seed = None if sampling.seed is None else sampling.seed % 2**64
        self._rng = None if sampling.greedy else np.random.default_rng(seed)

    def choose(
        self, logits: np.ndarray, allowed: np.ndarray | None = None
    ) -> tuple[int, TokenLogprob | None]:
        """The next token from one position's logits, and its log probability when asked for
        (the model's own distribution, before penalty, grammar and temperature, as og reports
        it); `allowed`: the grammar's mask (grammar_rows.py), the only tokens that may come."""
        top = self.sampling.logprobs
        row = None if top is None else log_softmax(logits)
        scores = self._penalized(logits)
        if allowed is not None:
            scores = np.where(allowed, scores, -np.inf)
        if self._rng is None:
            token = int(np.argmax(scores))
            # Greedy rows are only ever restricted by bans: the argmax stands unless it is
            # banned (no copy of the vocabulary per step for ignore_eos, as benchmarks send).
            if self._restricts and token in banned_ids(self.sampling, self.ends, self._generated):
                token = int(np.argmax(self._restricted(scores)))
        else:
            token = self._sample(self._restricted(scores) if self._restricts else scores)
        self._generated += 1
        if self._penalty != 1.0 and token not in self._seen:
            self._seen = np.union1d(self._seen, [token])
        return token, None if row is None else token_logprob(row, token, top or 0)

    def _restricted(self, scores: np.ndarray) -> np.ndarray:
        return restricted(scores, self.sampling, self.ends, self._generated)

    def _penalized(self, logits: np.ndarray) -> np.ndarray:
        if self._penalty == 1.0 or self._seen.size == 0:
            return logits
        # float64: a penalty near float32's smallest normal would overflow float32 logits to
        # inf, and softmax over inf is NaN.
        scores = logits.astype(np.float64, copy=True)
        picked = scores[self._seen]
        scores[self._seen] = np.where(picked > 0, picked / self._penalty, picked * self._penalty)
        return scores

    def _sample(self, scores: np.ndarray) -> int:
        assert self._rng is not None
        values = scores.astype(np.float64) / self.sampling.temperature
        probs = np.exp(values - values.max())
        probs /= probs.sum()
        if self.sampling.top_p >= 1.0:
            return int(self._rng.choice(probs.size, p=probs))
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # The smallest set whose mass reaches top_p (at least the likeliest token).
        order = order[: int(np.searchsorted(cumulative, self.sampling.top_p)) + 1]
        kept = probs[order]
        return int(order[self._rng.choice(len(order), p=kept / kept.sum())])
