"""How a batch of queued members becomes the backend's input, and its output each member's rows.

Token sequences (padding.py) and tensors of any shape (tensor_padding.py) are the two ways; the
dispatch runs either without knowing which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ferry.batcher.errors import InferenceFailed
from ferry.batcher.padding import PaddedBatch, pad_batch, unpad_outputs
from ferry.batcher.tensor_padding import (
    TensorBatch,
    TensorLayout,
    TensorRows,
    pad_tensors,
    split_outputs,
)

Rows = list[dict[str, np.ndarray]]

# Members of this many bytes in all are stacked in a worker thread, not on the event loop: numpy
# copies large arrays with the GIL released. 16 images of [3, 224, 224] FP32 (9.6 MB) take
# 2-3 ms to stack, the event loop's longest turn under image load (bench.images), which every
# other request and probe waited for. Below it, the hop to a thread costs more than the copy.
OFF_LOOP_BYTES = 1 << 20


class Packing(Protocol):
    def pack(self, members: Sequence[Any], outputs: tuple[str, ...] | None) -> Any:
        """The members as one padded batch, fetching `outputs` (None: all)."""

    def unpack(self, batch: Any, outputs: dict[str, np.ndarray]) -> Rows:
        """The backend's batch outputs as each member's own rows."""

    def off_loop(self, members: Sequence[Any]) -> bool:
        """Whether packing these members copies enough to leave the event loop for."""


class TokenPacking:
    def __init__(self, pad_token_id: int, sequence_outputs: frozenset[str]) -> None:
        self._pad_token_id = pad_token_id
        self._sequence_outputs = sequence_outputs

    def pack(self, members: Sequence[Any], outputs: tuple[str, ...] | None) -> PaddedBatch:
        return pad_batch(members, self._pad_token_id, outputs)

    def unpack(self, batch: PaddedBatch, outputs: dict[str, np.ndarray]) -> Rows:
        for name, value in outputs.items():
            if value.shape[0] != batch.size:
                raise InferenceFailed(
                    f"output {name!r} has {value.shape[0]} rows for a batch of {batch.size}"
                )
        return unpad_outputs(outputs, batch.lengths, self._sequence_outputs, batch.outputs)

    def off_loop(self, members: Sequence[Any]) -> bool:
        return False  # token ids: kilobytes a batch


class TensorPacking:
    def __init__(self, layout: TensorLayout) -> None:
        self._layout = layout

    def pack(self, members: Sequence[Any], outputs: tuple[str, ...] | None) -> TensorBatch:
        return pad_tensors(members, self._layout, outputs)

    def unpack(self, batch: TensorBatch, outputs: dict[str, np.ndarray]) -> Rows:
        return split_outputs(batch, outputs, self._layout)

    def off_loop(self, members: Sequence[TensorRows]) -> bool:
        total = sum(t.nbytes for m in members for t in m.tensors.values())
        return len(members) > 1 and total >= OFF_LOOP_BYTES
