"""Triton's classification extension: an output asked for with `parameters.classification = k`
comes back as its k highest values, each a BYTES string "value:index[:label]".

Batched models answer [N, k] (the top k of each row), a model with a fixed first axis [k] (of
the whole tensor), as Triton does; a ZipMap output is always by row, its rows being the model's.
Ties keep the lower index first. Labels are the model config's (`labels`), else the classes a
ZipMap output names, or a text classifier's `id2label` (its manifest) for `logits`. Unlike
Triton, which quietly returns fewer, a k above the output's class count is refused, as is an
output that holds no scores (BYTES, BOOL, a per-token sequence); all decided before any work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ferry.backends import bfloat16
from ferry.server.errors import InvalidInput
from ferry.server.kserve.kserve_model import KServeModel

PARAMETER = "classification"
UNSCORED = ("BYTES", "BOOL")


@dataclass(frozen=True)
class Classification:
    count: int  # k
    labels: tuple[str, ...] | None  # by class index, when the model has them
    batched: bool  # top k per row; else of the whole tensor
    bf16: bool = False  # scores given as BF16 bits


def requested(outputs: Iterable[tuple[str, Any]]) -> dict[str, int]:
    """(output, its `classification` parameter) -> k by output, each checked; a parameter not
    sent is given as None."""
    counts = {}
    for name, value in outputs:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(name, "parameters.classification must be a positive integer")
        counts[name] = value
    return counts


def plan(model: KServeModel, counts: Mapping[str, int]) -> dict[str, Classification]:
    """What each classified output needs, checked against the model before any work."""
    plans = {}
    for name, count in counts.items():
        scores = model.scores(name)
        if scores.datatype in UNSCORED:
            raise InvalidInput(
                name, f"classification needs scores; this output is {scores.datatype}"
            )
        if scores.classes is not None and count > scores.classes:
            raise InvalidInput(
                name, f"classification {count} is more than the output's {scores.classes} classes"
            )
        bf16 = scores.datatype == "BF16"
        plans[name] = Classification(count, scores.labels, scores.batched, bf16)
    return plans


def classify(name: str, value: np.ndarray, plan: Classification) -> np.ndarray:
    """The top k of each row (or of the whole tensor) as "value:index[:label]" bytes."""
    if plan.bf16:
        value = bfloat16.to_float32(value)
    rows = value.reshape(len(value), -1) if plan.batched else value.reshape(1, -1)
    classes = rows.shape[1]
    if plan.count > classes:  # only where the count was not known before the run
        raise InvalidInput(
            name, f"classification {plan.count} is more than the output's {classes} classes"
        )
    # Descending, ties to the lower index: a stable ascending sort of the reversed columns.
    order = classes - 1 - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1]
    top = order[:, : plan.count]
    strings = np.empty(top.shape, dtype=object)
    for r, row in enumerate(top):
        for c, index in enumerate(row):
            text = f"{_number(rows[r, index])}:{index}"
            if plan.labels is not None and index < len(plan.labels):  # else: classes unforeseen
                text += f":{plan.labels[index]}"
            strings[r, c] = text.encode()
    return strings if plan.batched else strings[0]


def _number(value: np.generic) -> str:
    """Shortest text that reads back as the same value (Triton writes 6 decimals)."""
    if isinstance(value, np.floating):
        return np.format_float_positional(value, unique=True, trim="0")
    return str(value)


def apply(
    outputs: dict[str, np.ndarray], plans: Mapping[str, Classification]
) -> dict[str, np.ndarray]:
    return {n: classify(n, v, plans[n]) if n in plans else v for n, v in outputs.items()}
