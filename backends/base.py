"""The backend interface: small on purpose (TGI's Backend trait has four methods).

Blocking runtimes (ONNX Runtime, TensorRT) run in an executor *inside* the backend; callers see
only coroutines.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ferry.batcher.padding import PaddedBatch


class Backend(Protocol):
    name: str
    # Output names, and those among them with a sequence axis (unpadded per request).
    output_names: tuple[str, ...]
    sequence_outputs: frozenset[str]
    # How many batches may run at once and still pay off (sessions, instances).
    max_concurrency: int
    # A batch handed over while all of those run waits inside the backend and starts, in the
    # backend's own threads, the moment one frees (so the batcher may form one ahead).
    queues_batches: bool
    # The model reads segment ids (BERT's token_type_ids); valid once started.
    takes_token_types: bool

    async def start(self) -> None:
        """Load and warm up; readiness turns on only after this returns."""

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        """Run one padded batch; every output has the batch on its first axis."""

    async def health(self) -> bool:
        """True while the backend can serve."""

    async def close(self) -> None:
        """Release sessions, connections and threads."""
