"""A token model's KServe v2 inference (token_graph.py's `infer`), and the request parameters
every model's requests share.

Inputs arrive as arrays, decoded by the model's signature (tensor_codec.py): `input_ids` (and
optionally `attention_mask`) INT64 [batch, seq], or `text` BYTES [batch] / [batch, 1] (UTF-8,
tokenized here with the model's tokenizer). Padded tensors stay padded through validation; each
row is queued as a view cut to its real length, so the batcher batches it with any other
traffic. Outputs are FP32; sequence outputs are padded back to the request's width.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from ferry.batcher import stack_rows
from ferry.server.encoder import EncoderServing
from ferry.server.encoder_model import EncoderModel
from ferry.server.encoder_request import EncoderInputs, Texts, TokenArrays, item_field
from ferry.server.errors import InvalidInput
from ferry.server.kserve.model_config import TEXT_INPUT, TOKEN_INPUTS, TYPES_INPUT
from ferry.server.schemas import PRIORITY_MAX, PRIORITY_MIN


def decoded_texts(texts: np.ndarray) -> list[str]:
    if texts.ndim == 2 and texts.shape[1] == 1:
        texts = texts[:, 0]
    if texts.ndim != 1:
        raise InvalidInput(
            TEXT_INPUT, f"text must be [batch] or [batch, 1], got {list(texts.shape)}"
        )
    decoded, count = [], texts.shape[0]
    for index, item in enumerate(texts.tolist()):
        try:
            decoded.append(item.decode() if isinstance(item, bytes) else str(item))
        except UnicodeDecodeError:
            raise InvalidInput(item_field(TEXT_INPUT, index, count), "text must be UTF-8") from None
    return decoded


def token_arrays(tensors: dict[str, np.ndarray]) -> TokenArrays:
    ids = tensors["input_ids"]
    mask = tensors.get("attention_mask", np.ones_like(ids))
    types = tensors.get(TYPES_INPUT)
    if ids.ndim != 2:
        raise InvalidInput("input_ids", f"input_ids must be [batch, seq], got {list(ids.shape)}")
    for name, value in (("attention_mask", mask), (TYPES_INPUT, types)):
        if value is not None and value.shape != ids.shape:
            raise InvalidInput(
                name, f"shape {list(value.shape)} differs from input_ids {list(ids.shape)}"
            )
    return TokenArrays(ids, mask, token_type_ids=types)


def encoder_inputs(tensors: dict[str, np.ndarray]) -> EncoderInputs:
    """The request's tensors as the encoder's input, named as this protocol names them."""
    unknown = set(tensors) - {*TOKEN_INPUTS, TYPES_INPUT, TEXT_INPUT}
    if unknown:
        raise InvalidInput(
            sorted(unknown)[0],
            "inputs are input_ids (+ attention_mask, token_type_ids), or text",
        )
    if TEXT_INPUT in tensors:
        if set(tensors) & {*TOKEN_INPUTS, TYPES_INPUT}:
            raise InvalidInput(TEXT_INPUT, "send either text or input_ids, not both")
        return Texts(decoded_texts(tensors[TEXT_INPUT]), TEXT_INPUT)
    if "input_ids" not in tensors:
        raise InvalidInput("input_ids", "input_ids (or text) is required")
    return token_arrays(tensors)


ABSENT = object()  # a parameter not sent at all (null is sent, and refused)


def request_priority(value: object = ABSENT) -> int:
    """`parameters.priority` (vLLM's meaning: lower first), checked; 0 when absent."""
    if value is ABSENT:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput("priority", "parameters.priority must be an integer")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidInput(
            "priority", f"parameters.priority must be within {PRIORITY_MIN}..{PRIORITY_MAX}"
        )
    return value


async def infer_tensors(
    model: EncoderModel,
    encoder: EncoderServing,
    tensors: dict[str, np.ndarray],
    wanted: Sequence[str],
    disconnected: asyncio.Future[None] | None = None,
    priority: int = 0,
) -> dict[str, np.ndarray]:
    """Inputs -> the wanted outputs, through the one encoder path and the model's batcher."""
    valid = await encoder.validate(model, encoder_inputs(tensors), tuple(wanted), None, priority)
    result = await encoder.run(model, valid, disconnected)
    sequence = model.backend.sequence_outputs
    return {
        n: stack_rows([r[n] for r in result.rows], valid.width if n in sequence else None).astype(
            np.float32, copy=False
        )
        for n in wanted
    }
