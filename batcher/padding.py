"""Pad a batch to its own longest sequence, and cut each caller's rows back out. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ferry.batcher.request import TokenSequence


@dataclass(frozen=True)
class PaddedBatch:
    input_ids: np.ndarray  # (batch, padded_length) int64
    attention_mask: np.ndarray  # (batch, padded_length) int64
    lengths: tuple[int, ...]
    # Outputs some member asked for; None: all of them. Backends fetch only these, so an output
    # nobody wants (an L x 384 hidden state) is never copied out of the runtime.
    outputs: tuple[str, ...] | None = None
    # Nothing else queued or running when it was formed: a backend may give it every core.
    runs_alone: bool = False
    # (batch, padded_length) int64 segment ids, 0 in the padding; None: no member sent any
    # (a model that takes them gets zeros).
    token_type_ids: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def padded_length(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def padded_tokens(self) -> int:
        return self.size * self.padded_length

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)


def pad_batch(
    sequences: Sequence[TokenSequence],
    pad_token_id: int = 0,
    outputs: tuple[str, ...] | None = None,
) -> PaddedBatch:
    """Right-pad to the longest sequence in *this* batch, never to the model's maximum."""
    lengths = tuple(seq.length for seq in sequences)
    if len(sequences) == 1:  # nothing to pad (most batches under mixed load): a copy of the row
        # A copy, not a view: rows from the engine process's wire are read-only buffers, which
        # torch.from_numpy warns about.
        (seq,) = sequences
        ids = np.array(seq.input_ids[None], dtype=np.int64)
        types = seq.token_type_ids
        return PaddedBatch(
            ids,
            np.array(seq.attention_mask[None], dtype=np.int64),
            lengths,
            outputs,
            token_type_ids=None if types is None else np.array(types[None], dtype=np.int64),
        )
    width = max(lengths)
    input_ids = np.full((len(sequences), width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(sequences), width), dtype=np.int64)
    paired = any(seq.token_type_ids is not None for seq in sequences)
    # Segment ids pad with 0, as the mask does; a member without any keeps zeros.
    token_type_ids = np.zeros_like(input_ids) if paired else None
    for row, seq in enumerate(sequences):
        input_ids[row, : seq.length] = seq.input_ids
        attention_mask[row, : seq.length] = seq.attention_mask
        if token_type_ids is not None and seq.token_type_ids is not None:
            token_type_ids[row, : seq.length] = seq.token_type_ids
    return PaddedBatch(input_ids, attention_mask, lengths, outputs, token_type_ids=token_type_ids)


def unpad_outputs(
    outputs: dict[str, np.ndarray],
    lengths: Sequence[int],
    sequence_outputs: frozenset[str],
    wanted: tuple[str, ...] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Split batch outputs per request; outputs with a sequence axis lose their padding.

    Only the `wanted` outputs (all when None) are split: a backend may return more.
    """
    rows: list[dict[str, np.ndarray]] = [{} for _ in lengths]
    for name, value in outputs.items():
        if wanted is not None and name not in wanted:
            continue
        for row, length in enumerate(lengths):
            rows[row][name] = value[row, :length] if name in sequence_outputs else value[row]
    return rows


def stack_rows(parts: Sequence[np.ndarray], width: int | None = None) -> np.ndarray:
    """Per-row arrays stacked into one batch array; with `width`, each row's first (sequence)
    axis is right-padded with zeros to it first: `unpad_outputs`'s inverse for one output."""
    if width is not None:
        parts = [np.pad(p, [(0, width - p.shape[0])] + [(0, 0)] * (p.ndim - 1)) for p in parts]
    return np.stack(parts)
