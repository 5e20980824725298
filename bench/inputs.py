"""The benchmark's inputs: token id sequences of seeded random lengths."""

from __future__ import annotations

import numpy as np


def token_sequences(count: int, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=count)
    # [CLS] ordinary word pieces [SEP], as the tokenizer would produce.
    return [[101, *rng.integers(2000, 29000, size=n - 2).tolist(), 102] for n in lengths]
