"""A request of more rows than one batch takes, split into chunks and its answers put back together.

Triton refuses such a request; here each chunk is one member of the queue, batched with any other
traffic within max_batch_size rows (policy.within_rows), and the request's answer is its chunks'
rows in order. A request is rectangular, so
every chunk keeps its padded axis sizes: each chunk's outputs are cut back exactly as the whole
request's would be. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ferry.batcher.policy import BatchLimits, most_at
from ferry.batcher.tensor_padding import TensorRows


def chunk_rows(rows: TensorRows, limits: BatchLimits) -> int:
    """Rows a chunk holds: at most max_batch_size, and no more than max_batch_tokens' elements
    (one row at least: a row over the limit still runs, alone)."""
    return most_at(limits, max(1, math.ceil(rows.length / max(1, rows.rows))))


def split_rows(rows: TensorRows, size: int) -> list[TensorRows]:
    """`rows` in chunks of `size` rows (the last may hold fewer); itself when it fits one."""
    if rows.rows <= size:
        return [rows]
    return [
        replace(
            rows,
            tensors={name: t[start : start + size] for name, t in rows.tensors.items()},
            rows=min(size, rows.rows - start),
        )
        for start in range(0, rows.rows, size)
    ]


def join_rows(answers: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The chunks' answers, in order, as the one request's."""
    if len(answers) == 1:
        return answers[0]
    return {name: np.concatenate([a[name] for a in answers]) for name in answers[0]}
