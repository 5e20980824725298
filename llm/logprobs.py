"""Log probabilities from raw logits, for engines whose runtime returns logits, not logprobs."""

from __future__ import annotations

import numpy as np

from ferry.llm.base import TokenLogprob


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise natural-log softmax in float64 (the model's distribution, before sampling)."""
    values = logits.astype(np.float64)
    shifted = values - values.max(axis=-1, keepdims=True)
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return result


def token_logprob(logprobs: np.ndarray, token_id: int, top: int) -> TokenLogprob:
    """The chosen token's entry from one position's log-softmax row, with the `top` likeliest."""
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        ids = np.argpartition(-logprobs, top - 1)[:top]
        ids = ids[np.argsort(-logprobs[ids], kind="stable")]
        best = tuple((int(i), float(logprobs[i])) for i in ids)
    return TokenLogprob(int(token_id), float(logprobs[token_id]), best)


def prompt_logprobs(
    logits: np.ndarray, prompt_ids: list[int], top: int
) -> tuple[TokenLogprob | None, ...]:
    """[seq, vocab] logits of a prompt -> each token's entry; row i predicts token i + 1."""
    return (None, *next_logprobs(logits, prompt_ids[1:], top))


def next_logprobs(logits: np.ndarray, next_ids: list[int], top: int) -> tuple[TokenLogprob, ...]:
    """[rows, vocab] logits of consecutive positions -> the entry of next_ids[i] from row i (a
    prompt in pieces scores each piece as it goes in; rows past next_ids are not read)."""
    rows = log_softmax(logits[: len(next_ids)])
    return tuple(token_logprob(row, next_ids[i], top) for i, row in enumerate(rows))
