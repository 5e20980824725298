"""An encoder request before and after validation, as plain values (arrays, ints, strings).

Each route parses its protocol into one of three input kinds, naming its items as its clients
know them (`inputs`, `input`, `input_ids`, `text`). `encoder_validation.py` turns that, once, into
a `ValidSequences`: nothing downstream checks it again. It holds no callbacks or server objects,
so it can cross a process boundary as it is (TEI's `ValidEncoding`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ferry.batcher import TokenSequence


@dataclass(frozen=True)
class Texts:
    """Texts for the model's tokenizer."""

    texts: Sequence[str]
    field: str
    truncate: bool = False
    # A cross-encoder's pairs: texts[i] with pairs[i], tokenized as one input with segment ids.
    pairs: Sequence[str] | None = None
    # What the route calls the pairs' first texts (`query`); None: `field`.
    first_field: str | None = None


@dataclass(frozen=True)
class TokenLists:
    """Token ids from JSON: one list per item, ragged; the mask optional."""

    input_ids: Sequence[Sequence[int]]
    attention_mask: Sequence[Sequence[int]] | None
    field: str
    token_type_ids: Sequence[Sequence[int]] | None = None


@dataclass(frozen=True)
class TokenArrays:
    """Right-padded [items, width] int64 tensors of equal shape (KServe): they stay padded."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    field: str = "input_ids"
    token_type_ids: np.ndarray | None = None


EncoderInputs = Texts | TokenLists | TokenArrays
MASK_FIELD = "attention_mask"
TYPES_FIELD = "token_type_ids"


def item_field(field: str, index: int, count: int) -> str:
    """`name[i]`: the one way every route names an item (a lone item by its field alone)."""
    return f"{field}[{index}]" if count > 1 else field


@dataclass(frozen=True)
class ValidSequences:
    """One encoder request, validated: its tokens (right-padded, each row's real length in
    `lengths`), the outputs it wants (checked against the model), its wire field name, deadline
    and priority."""

    model: str
    input_ids: np.ndarray  # [items, width] int64
    attention_mask: np.ndarray  # [items, width] int64, 0 past each row's length
    lengths: tuple[int, ...]
    tokens: int  # sum(lengths): the request's size for limits and usage
    outputs: tuple[str, ...]
    field: str
    timeout_s: float | None = None
    priority: int = 0
    # [items, width] int64 segment ids (0 past each row's length); None: none sent.
    token_type_ids: np.ndarray | None = None

    @property
    def count(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        """The request's own padded width: sequence outputs are padded back to it."""
        return int(self.input_ids.shape[1])

    def item(self, index: int) -> str:
        return item_field(self.field, index, self.count)

    def sequences(self) -> list[TokenSequence]:
        """Each row cut to its length (views, no copies), as the batcher queues them."""
        types = self.token_type_ids
        return [
            TokenSequence(
                self.input_ids[i, :length],
                self.attention_mask[i, :length],
                None if types is None else types[i, :length],
            )
            for i, length in enumerate(self.lengths)
        ]
