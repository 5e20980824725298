"""The encoder path's one validation boundary: parsed inputs in, a `ValidSequences` out.

Every check a request must pass before it is queued happens here, once, cheapest first (counts
and sizes before tokenizing or copying anything), and each refusal names the field as the
route's clients know it. Routes only parse their protocol; the batcher asserts, not checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from ferry.batcher import BatchLimits
from ferry.batcher.admission import request_places
from ferry.server import tracing
from ferry.server.encoder_model import EncoderModel
from ferry.server.encoder_request import (
    MASK_FIELD,
    TYPES_FIELD,
    EncoderInputs,
    Texts,
    TokenArrays,
    TokenLists,
    ValidSequences,
    item_field,
)
from ferry.server.errors import InvalidInput
from ferry.server.settings import Settings
from ferry.server.tokenization import TextRejected

# Bytes a float takes in a JSON answer (orjson, float32: "-0.012345678,"), for the size bound.
JSON_BYTES_PER_FLOAT = 14


class EncoderValidation:
    def __init__(self, settings: Settings) -> None:
        self._limits = settings

    async def validate(
        self,
        model: EncoderModel,
        inputs: EncoderInputs,
        outputs: tuple[str, ...],
        timeout_s: float | None = None,
        priority: int = 0,
    ) -> ValidSequences:
        """`inputs` checked against the request limits and `model`; `outputs` were checked by
        `model.outputs.select`. Raises InvalidInput naming the field (`name[i]` for an item)."""
        try:
            return await self._validate(model, inputs, outputs, timeout_s, priority)
        except InvalidInput:
            model.count_invalid()
            raise

    async def _validate(
        self,
        model: EncoderModel,
        inputs: EncoderInputs,
        outputs: tuple[str, ...],
        timeout_s: float | None,
        priority: int,
    ) -> ValidSequences:
        field, vocab_size = inputs.field, model.manifest.vocab_size
        self._check_count(field, _count(inputs), model.settings.batching)
        types: np.ndarray | None = None
        if isinstance(inputs, TokenArrays):
            ids, mask, types = inputs.input_ids, inputs.attention_mask, inputs.token_type_ids
            lengths = _lengths_of(mask)
            _check_lengths(field, lengths, model.manifest.max_length)
            _check_ids(field, ids, lengths, vocab_size)
            _check_mask(mask)
            if types is not None:
                types = _checked_types(model, types, lengths)
        elif isinstance(inputs, TokenLists):
            lengths = tuple(len(ids) for ids in inputs.input_ids)
            _check_lengths(field, lengths, model.manifest.max_length)
            ids, mask = _padded_lists(inputs, lengths)
            _check_ids(field, ids, lengths, vocab_size)
            if inputs.attention_mask is not None:  # else made here: ones, then padding
                _check_mask(mask)
            if inputs.token_type_ids is not None:
                types = _checked_types(model, _padded_types(inputs, lengths), lengths)
        else:
            # The tokenizer's ids, mask and segment ids need no checks: only their lengths.
            ids, mask, types, lengths = await self._tokenized(model, inputs)
            if not model.backend.takes_token_types:
                types = None  # a pair is still told apart by its separator tokens
        tokens = sum(lengths)
        if tokens > self._limits.max_tokens_per_request:
            raise InvalidInput(
                field, f"{tokens} tokens; at most {self._limits.max_tokens_per_request} per request"
            )
        self._check_response_size(model, outputs, len(lengths), tokens)
        if timeout_s is not None:
            model.check_deadline(max(lengths), timeout_s)
        return ValidSequences(
            model.name, ids, mask, lengths, tokens, outputs, field, timeout_s, priority, types
        )

    async def _tokenized(
        self, model: EncoderModel, inputs: Texts
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[int, ...]]:
        field, count = inputs.field, len(inputs.texts)
        # A pair's first text is the route's own field (a query); the item named is the second.
        named = inputs.texts if inputs.pairs is None else inputs.pairs
        for index, text in enumerate(named):
            if len(text) > self._limits.max_chars_per_text:
                raise InvalidInput(
                    item_field(field, index, count),
                    f"text has {len(text)} characters; at most {self._limits.max_chars_per_text}",
                )
        pairs = None if inputs.pairs is None else list(inputs.pairs)
        try:
            with tracing.span("ferry.tokenize", **{"ferry.items": count}):
                tokenized = await model.tokenizer.encode_async(
                    list(inputs.texts), inputs.truncate, pairs
                )
        except TextRejected as exc:
            raise InvalidInput(_rejected_field(inputs, exc), exc.message) from None
        _check_lengths(field, tokenized.lengths, model.manifest.max_length, texts=True)
        return (
            tokenized.input_ids,
            tokenized.attention_mask,
            tokenized.token_type_ids,
            tokenized.lengths,
        )

    def _check_count(self, field: str, count: int, batching: BatchLimits) -> None:
        if count == 0:
            raise InvalidInput(field, "the input list is empty")
        if count > self._limits.max_items_per_request:
            raise InvalidInput(
                field, f"{count} items; at most {self._limits.max_items_per_request} per request"
            )
        places = request_places(batching)
        if count > places:
            # More than one request may hold of the model's queue: a 429 would promise a retry
            # that cannot succeed (the batcher queues a request's items all or none).
            raise InvalidInput(
                field,
                f"{count} items; one request may take at most {places} of this model's "
                f"{batching.max_queue_size} queue places",
            )

    def _check_response_size(
        self, model: EncoderModel, outputs: Sequence[str], count: int, tokens: int
    ) -> None:
        """Refuse before running what would answer with more bytes than the bound allows."""
        floats = sum(
            model.outputs.width(name) * (tokens if model.outputs.is_sequence(name) else count)
            for name in outputs
        )
        estimate = floats * JSON_BYTES_PER_FLOAT
        limit = self._limits.max_response_bytes
        if estimate > limit:
            raise InvalidInput(
                "outputs",
                f"the answer would be about {estimate // 2**20} MiB; at most {limit // 2**20} MiB "
                "per response (ask for fewer items or outputs)",
            )


def _rejected_field(inputs: Texts, exc: TextRejected) -> str:
    """The text at fault as the route names it: a pair's first text by the route's own field
    for it, without an index when every pair has the same one (a query)."""
    count = len(inputs.texts)
    if not exc.first:
        return item_field(inputs.field, exc.index, count)
    field = inputs.first_field or inputs.field
    shared = len({id(text) for text in inputs.texts}) == 1
    return field if shared else item_field(field, exc.index, count)


def _count(inputs: EncoderInputs) -> int:
    if isinstance(inputs, TokenArrays):
        return int(inputs.input_ids.shape[0])
    return len(inputs.texts if not isinstance(inputs, TokenLists) else inputs.input_ids)


def _lengths_of(mask: np.ndarray) -> tuple[int, ...]:
    """Each padded row's length: up to its mask's last 1 (a hole in the mask is not the end).
    An all-zero row keeps its whole width, so that the value check names the problem."""
    if mask.shape[1] == 0:
        return (0,) * cast(int, mask.shape[0])
    attended = mask != 0
    last = mask.shape[1] - np.argmax(attended[:, ::-1], axis=1)
    return cast(
        "tuple[int, ...]", tuple(np.where(attended.any(axis=1), last, mask.shape[1]).tolist())
    )


def _check_lengths(
    field: str, lengths: Sequence[int], max_length: int, texts: bool = False
) -> None:
    count = len(lengths)
    for index, length in enumerate(lengths):
        if length == 0:
            raise InvalidInput(
                item_field(field, index, count), "input_ids must be a non-empty list of token ids"
            )
        if length > max_length:
            message = (
                f"text is {length} tokens long; this model takes at most {max_length} "
                "(send truncate=true to cut it)"
                if texts
                else f"sequence has {length} tokens; this model takes at most {max_length}"
            )
            raise InvalidInput(item_field(field, index, count), message)


def _padded_lists(inputs: TokenLists, lengths: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """JSON lists into right-padded int64 arrays; a value no int64 holds is invalid input."""
    field, masks, count = inputs.field, inputs.attention_mask, len(lengths)
    if masks is not None:
        _check_count(MASK_FIELD, masks, count)
    if masks is None and min(lengths) == max(lengths) > 0:
        try:  # one conversion for equal lengths (a lone item always): no padding to place
            ids = np.asarray(inputs.input_ids, dtype=np.int64)
            return ids, np.ones_like(ids)
        except (OverflowError, ValueError, TypeError):
            pass  # the loop below names the item at fault
    ids = np.zeros((count, max(lengths)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for index, length in enumerate(lengths):
        try:
            ids[index, :length] = inputs.input_ids[index]
        except (OverflowError, ValueError, TypeError):
            raise InvalidInput(
                item_field(field, index, count), "token ids must be integers in [0, 2**63)"
            ) from None
        if masks is None:
            mask[index, :length] = 1
        else:
            _place_row(mask, MASK_FIELD, index, length, masks[index])
    return ids, mask


def _padded_types(inputs: TokenLists, lengths: tuple[int, ...]) -> np.ndarray:
    """token_type_ids from JSON, shaped like input_ids, right-padded with 0."""
    types, count = inputs.token_type_ids, len(lengths)
    assert types is not None
    _check_count(TYPES_FIELD, types, count)
    padded = np.zeros((count, max(lengths)), dtype=np.int64)
    for index, length in enumerate(lengths):
        _place_row(padded, TYPES_FIELD, index, length, types[index])
    return padded


def _check_count(field: str, rows: Sequence[object], count: int) -> None:
    """attention_mask or token_type_ids from JSON: a list for each item of input_ids."""
    if len(rows) != count:
        raise InvalidInput(field, f"{field} has {len(rows)} items but input_ids has {count}")


def _place_row(padded: np.ndarray, field: str, index: int, length: int, row: Sequence[int]) -> None:
    """One item's attention_mask or token_type_ids (0s and 1s, as many as its input_ids) into
    its row of `padded`, whose padding stays 0."""
    count = len(padded)
    if len(row) != length:
        raise InvalidInput(
            item_field(field, index, count),
            f"{field} has {len(row)} values but input_ids has {length}",
        )
    try:
        padded[index, :length] = row
    except (OverflowError, ValueError, TypeError):
        raise InvalidInput(
            item_field(field, index, count), f"{field} values must be 0 or 1"
        ) from None


def _checked_types(
    model: EncoderModel, types: np.ndarray, lengths: Sequence[int]
) -> np.ndarray | None:
    """A client's segment ids: 0 (first text) or 1 (second), shaped like input_ids; refused
    when the model reads none, unless all are 0 (what such a model assumes anyway)."""
    count = len(lengths)
    real = _padding_zeroed(types, lengths)
    bad = (real < 0) | (real > 1)
    if bad.any():
        index = int(np.argmax(bad.any(axis=1)))
        raise InvalidInput(
            item_field(TYPES_FIELD, index, count), "token_type_ids values must be 0 or 1"
        )
    if not real.any():
        return None
    if not model.backend.takes_token_types:
        raise InvalidInput(
            TYPES_FIELD,
            f"model {model.name!r} takes no token_type_ids (its graph has no such input)",
        )
    return real.astype(np.int64, copy=False)


def _check_ids(field: str, ids: np.ndarray, lengths: Sequence[int], vocab_size: int) -> None:
    """Every id in the vocabulary, over each row's real part only (a client's padding is not
    the model's input). Whole-array min/max first: this runs on the loop."""
    real = ids if min(lengths) == ids.shape[1] else _padding_zeroed(ids, lengths)
    if int(real.min()) >= 0 and int(real.max()) < vocab_size:
        return
    for index, row in enumerate(real):
        low, high = int(row.min()), int(row.max())
        if low < 0 or high >= vocab_size:
            raise InvalidInput(
                item_field(field, index, len(lengths)),
                f"token id {low if low < 0 else high} is outside the vocabulary [0, {vocab_size})",
            )


def _check_mask(mask: np.ndarray) -> None:
    """A client's mask: 0 or 1, and at least one token kept per row."""
    count = mask.shape[0]
    if int(mask.min()) < 0 or int(mask.max()) > 1:
        index = int(np.argmax(((mask < 0) | (mask > 1)).any(axis=1)))
        raise InvalidInput(
            item_field(MASK_FIELD, index, count), "attention_mask values must be 0 or 1"
        )
    kept = mask.any(axis=1)
    if not kept.all():
        raise InvalidInput(
            item_field(MASK_FIELD, int(np.argmin(kept)), count),
            "attention_mask must keep at least one token",
        )


def _padding_zeroed(ids: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
    real = np.arange(ids.shape[1]) < np.asarray(lengths)[:, None]
    return np.where(real, ids, 0)
