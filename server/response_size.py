"""A plain graph's answer bounded before it is written: its outputs' size is known only once it
ran (a graph may answer 1000x what it was sent), so the bound is checked between the run and
the serialising, and a large answer is written off the event loop (large_bodies.py's thread).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

import numpy as np

from ferry.server.encoder_validation import JSON_BYTES_PER_FLOAT
from ferry.server.errors import InvalidInput
from ferry.server.large_bodies import decoded

T = TypeVar("T")
# A string output's JSON bytes per element beyond its own length (quotes, comma).
JSON_BYTES_PER_STRING = 3


def answer_bytes(value: np.ndarray, binary: bool = False) -> int:
    """About how many bytes `value` takes in an answer: raw when binary, else as JSON."""
    if value.dtype == object:
        return sum(len(item) + JSON_BYTES_PER_STRING for item in value.flat)
    return value.nbytes if binary else value.size * JSON_BYTES_PER_FLOAT


def check_response_size(
    outputs: Mapping[str, np.ndarray], limit: int, binary: Collection[str] = ()
) -> int:
    """The answer's estimated size; over `limit` (max_response_bytes), a 4xx naming its
    largest output, before a byte of it is written."""
    sizes = {name: answer_bytes(value, name in binary) for name, value in outputs.items()}
    total = sum(sizes.values())
    if total > limit:
        largest = max(sizes, key=lambda name: sizes[name])
        raise InvalidInput(
            largest,
            f"the answer would be about {total // 2**20} MiB ({largest}: "
            f"{sizes[largest] // 2**20} MiB); at most {limit // 2**20} MiB per response "
            "(max_response_bytes): send fewer rows or ask for fewer outputs",
        )
    return total


async def written(size: int, write: Callable[[], T]) -> T:
    """`write()` (rendering an answer of about `size` bytes), off the loop when large."""
    return await decoded(size, write)
