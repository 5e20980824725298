"""A token model's feed, read from its graph: which input is the ids, the mask and the segment
ids, under which names and in which integer type.

Exports differ: transformers' and optimum's BERT takes `token_type_ids` beside `input_ids` and
`attention_mask`, TensorFlow-born graphs name them `input_mask` and `segment_ids`, some take
int32 ids, some no mask. The graph says which; the batcher's int64 arrays are cast to what it
declares, and segment ids a request did not send are zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from ferry.batcher.padding import PaddedBatch

Role = Literal["input_ids", "attention_mask", "token_type_ids"]
# Input names by role, as the common exporters write them (lower-cased, without a ":0" suffix).
ROLE_NAMES: dict[Role, tuple[str, ...]] = {
    "input_ids": ("input_ids", "ids", "input", "tokens", "token_ids", "input_word_ids"),
    "attention_mask": ("attention_mask", "input_mask", "mask"),
    "token_type_ids": ("token_type_ids", "segment_ids", "input_type_ids", "type_ids"),
}
# ONNX integer (and mask-friendly) element types, as onnxruntime spells them.
DTYPES: dict[str, type] = {
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(float)": np.float32,
    "tensor(bool)": np.bool_,
}
ID_TYPES = ("tensor(int64)", "tensor(int32)")


class GraphInput(Protocol):
    """What onnxruntime's NodeArg offers: a name, an element type and a shape."""

    name: str
    type: str
    shape: Sequence[int | str | None]


class UnservableInputs(ValueError):
    """The graph's inputs are not a token model's; the message names the input at fault."""


@dataclass(frozen=True)
class FeedInput:
    name: str  # as the graph spells it
    role: Role
    dtype: type


@dataclass(frozen=True)
class TokenFeed:
    inputs: tuple[FeedInput, ...]
    # The ids input's second axis (a symbolic name or a size): outputs sharing it are padded.
    sequence_axis: int | str | None

    @classmethod
    def from_graph(cls, graph_inputs: Sequence[GraphInput], model: str = "") -> TokenFeed:
        where = f"{model}: " if model else ""
        found: dict[Role, FeedInput] = {}
        axis = None
        for node in graph_inputs:
            role = role_of(node.name)
            if role is None or role in found:
                known = ", ".join(n for names in ROLE_NAMES.values() for n in names)
                raise UnservableInputs(
                    f"{where}input {node.name!r} is none of a token model's inputs, or names one "
                    f"twice (ids, mask and segment ids, named one of: {known})"
                )
            allowed = ID_TYPES if role != "attention_mask" else tuple(DTYPES)
            if node.type not in allowed:
                raise UnservableInputs(
                    f"{where}input {node.name!r} is {node.type}; a token model's {role} must be "
                    f"one of {', '.join(allowed)}"
                )
            if len(node.shape) != 2:
                raise UnservableInputs(
                    f"{where}input {node.name!r} has shape {list(node.shape)}; a token model's "
                    "inputs are [batch, sequence]"
                )
            found[role] = FeedInput(node.name, role, DTYPES[node.type])
            if role == "input_ids":
                axis = node.shape[1]
        if "input_ids" not in found:
            raise UnservableInputs(
                f"{where}no input is token ids (named one of {', '.join(ROLE_NAMES['input_ids'])})"
            )
        return cls(tuple(found.values()), axis)

    @property
    def takes_token_types(self) -> bool:
        return any(i.role == "token_type_ids" for i in self.inputs)

    def feeds(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        """The batch as the graph takes it (no copy where the types already agree)."""
        arrays: dict[Role, np.ndarray | None] = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids,
        }
        feeds: dict[str, np.ndarray] = {}
        for node in self.inputs:
            value = arrays[node.role]
            if value is None:  # segment ids nobody sent: all sentence A
                value = np.zeros_like(batch.input_ids)
            feeds[node.name] = value.astype(node.dtype, copy=False)
        return feeds

    def ones(self, batch: int, length: int) -> dict[str, np.ndarray]:
        """Warm-up and probing feeds: token 1 everywhere, nothing masked."""
        ids = np.ones((batch, length), dtype=np.int64)
        return self.feeds(PaddedBatch(ids, ids, (length,) * batch))


def role_of(name: str) -> Role | None:
    key = name.lower().split(":")[0]
    for role, names in ROLE_NAMES.items():
        if key in names:
            return role
    return None
