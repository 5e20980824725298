"""Plain request objects: what callers hand the batcher, and the queue entry it keeps."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from ferry.batcher.errors import InvalidInput


@dataclass(frozen=True)
class TokenSequence:
    """One tokenized input: 1-D int64 ids and a mask of the same length."""

    input_ids: np.ndarray
    attention_mask: np.ndarray

    @classmethod
    def from_ids(cls, ids: list[int], mask: list[int] | None = None) -> TokenSequence:
        """From JSON lists; a value no int64 holds is invalid input, not an overflow."""
        try:
            input_ids = np.asarray(ids, dtype=np.int64)
        except (OverflowError, ValueError, TypeError):
            raise InvalidInput("input_ids", "token ids must be integers in [0, 2**63)") from None
        if mask is None:
            return cls(input_ids, np.ones_like(input_ids))
        try:
            attention_mask = np.asarray(mask, dtype=np.int64)
        except (OverflowError, ValueError, TypeError):
            raise InvalidInput("attention_mask", "attention_mask values must be 0 or 1") from None
        return cls(input_ids, attention_mask)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class SequenceLimits:
    """What a model can take; checked before a request is queued."""

    max_length: int
    vocab_size: int

    def validate(self, seq: TokenSequence) -> None:
        ids, mask = seq.input_ids, seq.attention_mask
        if ids.ndim != 1 or ids.shape[0] == 0:
            raise InvalidInput("input_ids", "input_ids must be a non-empty list of token ids")
        if ids.shape[0] > self.max_length:
            raise InvalidInput(
                "input_ids",
                f"sequence has {ids.shape[0]} tokens; this model takes at most {self.max_length}",
            )
        if mask.shape != ids.shape:
            raise InvalidInput(
                "attention_mask",
                f"attention_mask has {mask.shape[0] if mask.ndim else 0} values "
                f"but input_ids has {ids.shape[0]}",
            )
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InvalidInput(
                "input_ids", f"token id {bad} is outside the vocabulary [0, {self.vocab_size})"
            )
        # min/max rather than np.isin: this runs for every request on the event loop.
        if int(mask.min()) < 0 or int(mask.max()) > 1:
            raise InvalidInput("attention_mask", "attention_mask values must be 0 or 1")
        if not mask.any():
            raise InvalidInput("attention_mask", "attention_mask must keep at least one token")


@dataclass(eq=False)
class QueuedRequest:
    """The batcher's queue entry: inputs, the caller's future and the times that matter."""

    sequence: TokenSequence
    future: asyncio.Future
    enqueued_at: float
    deadline: float | None
    # The outputs this caller wants; None: all of the backend's.
    outputs: frozenset[str] | None = None
    # vLLM's meaning: lower is served first.
    priority: int = 0
    # Its predicted share of the queue's work (admission's running sum), set when queued.
    cost_s: float = 0.0
    expiry: asyncio.TimerHandle | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        return self.sequence.length

    def fail(self, error: BaseException) -> None:
        """Resolve the future with `error`, unless it is resolved already (exactly once)."""
        if not self.future.done():
            self.future.set_exception(error)
