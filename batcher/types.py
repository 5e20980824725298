"""The types the batcher's parts share: the clock they read and the backend call they make."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from ferry.batcher.padding import PaddedBatch
from ferry.batcher.tensor_padding import TensorBatch

# A batch as its packing made it: token sequences padded, or tensors stacked (packing.py).
Batch = PaddedBatch | TensorBatch
InferFn = Callable[[Batch], Awaitable[dict[str, np.ndarray]]]
Result = dict[str, np.ndarray]


class Clock(Protocol):
    """Where the batcher reads the time and schedules its waits; the event loop is one.

    Tests pass a manual clock and advance it instead of sleeping.
    """

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Any: ...


def clock_or_loop(clock: Clock | None) -> Clock:
    """The given clock, or the running event loop's own (None: the loop's)."""
    return clock or asyncio.get_running_loop()
