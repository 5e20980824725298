"""Next-token choice from raw logits in numpy, for the batched CPU lane (ortgenai_batch.py).

The same settings onnxruntime-genai's search takes (ortgenai_lora.search_options): greedy,
temperature with nucleus (top_p; no implicit top-k, OpenAI's semantics), a seed, and its
repetition penalty (Hugging Face's: a positive logit of a token already in the prompt or the
output is divided by the penalty, a negative one multiplied), and a grammar's mask. Greedy is
`argmax`, as og's is: the first of equal maxima. Sampled tokens come from one
`numpy.random.Generator` per request, seeded when the request gives a seed (the same seed gives
the same text; not og's stream).
"""

from __future__ import annotations

import numpy as np

from ferry.llm.base import SamplingSettings, TokenLogprob
from ferry.llm.logprobs import log_softmax, token_logprob


class Sampler:
    """One request's token choice; `seen` holds prompt and output ids for the penalty."""

    def __init__(self, sampling: SamplingSettings, prompt_ids: list[int]) -> None:
        self.sampling = sampling
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
        token = int(np.argmax(scores)) if self._rng is None else self._sample(scores)
        if self._penalty != 1.0 and token not in self._seen:
            self._seen = np.union1d(self._seen, [token])
        return token, None if row is None else token_logprob(row, token, top or 0)

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
