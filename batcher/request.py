"""Plain request objects: what callers hand the batcher, and the queue entry it keeps."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ferry.batcher.tensor_padding import TensorRows
from ferry.batcher.tracing import QueueWait


@dataclass(frozen=True)
class TokenSequence:
    """One tokenized input: 1-D int64 ids and a mask of the same length, and segment ids
    (`token_type_ids`, BERT's sentence A / B) when the input is a pair; None: all zeros."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray | None = None

    @classmethod
    def from_ids(cls, ids: list[int], mask: list[int] | None = None) -> TokenSequence:
        """From lists of ids (and mask; all ones if absent), as int64."""
        input_ids = np.asarray(ids, dtype=np.int64)
        if mask is None:
            return cls(input_ids, np.ones_like(input_ids))
        return cls(input_ids, np.asarray(mask, dtype=np.int64))

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class SequenceLimits:
    """What a model can take. The server validates every request against it before submitting
    (server/encoder_validation.py); the batcher only asserts the shape it relies on."""

    max_length: int
    vocab_size: int

    def admits(self, seq: TokenSequence) -> bool:
        ids, mask, types = seq.input_ids, seq.attention_mask, seq.token_type_ids
        return (
            ids.ndim == 1
            and 0 < ids.shape[0] <= self.max_length
            and mask.shape == ids.shape
            and (types is None or types.shape == ids.shape)
        )


@dataclass(eq=False)
class QueuedRequest:
    """The batcher's queue entry: inputs, the caller's future and the times that matter."""

    sequence: TokenSequence | TensorRows  # its rows: what the batcher's packing stacks
    future: asyncio.Future[Any]
    enqueued_at: float
    deadline: float | None
    # The outputs this caller wants; None: all of the backend's.
    outputs: frozenset[str] | None = None
    # vLLM's meaning: lower is served first.
    priority: int = 0
    # Its predicted share of the queue's work (admission's running sum), set when queued.
    cost_s: float = 0.0
    # Its entry in the batcher's deadline heap (deadlines.py), while it may expire.
    expiry: list[Any] | None = field(default=None, repr=False)
    # Its wait's span when the request is traced (tracing.py); None: untraced.
    trace: QueueWait | None = field(default=None, repr=False)
    # Its sequence's, read once here: the queue, the cost model and the policy read it several
    # times per batch formed.
    length: int = field(init=False)

    def __post_init__(self) -> None:
        self.length = self.sequence.length

    @property
    def rows(self) -> int:
        """Rows it adds to a batch (max_batch_size counts them): one for a token sequence."""
        return getattr(self.sequence, "rows", 1)

    @property
    def requests(self) -> int:
        """Clients' requests it answers (the queue's bound and depth count them)."""
        return getattr(self.sequence, "requests", 1)

    @property
    def shape_key(self) -> tuple[object, ...]:
        """Only requests of one key share a batch (tensors' unpadded axes; tokens: one key)."""
        return getattr(self.sequence, "shape_key", ())

    def fail(self, error: BaseException) -> None:
        """Resolve the future with `error`, unless it is resolved already (exactly once)."""
        if not self.future.done():
            self.future.set_exception(error)
