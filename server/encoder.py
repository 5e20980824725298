"""One encoder serving path, shaped after TEI's `Infer::embed_pooled`.

/predict, /v1/embeddings and KServe v2 infer (HTTP and gRPC) each only parse their protocol and
render their answer; everything between (bounds checked before any work, tokenizing off the
loop, submitting with the outputs asked for, waiting unless the client leaves) happens here,
once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ferry.batcher import TokenSequence
from ferry.batcher.errors import InvalidInput
from ferry.server.disconnect import ClientDisconnected
from ferry.server.model_runtime import ModelRuntime
from ferry.server.settings import Settings

# Bytes a float takes in a JSON answer (orjson, float32: "-0.012345678,"), for the size bound.
JSON_BYTES_PER_FLOAT = 14


@dataclass(frozen=True)
class EncoderInputs:
    """What a route parsed: texts, token id lists, or ready arrays (KServe tensors)."""

    texts: Sequence[str] | None = None
    token_ids: Sequence[Sequence[int]] | None = None
    masks: Sequence[Sequence[int]] | None = None
    sequences: Sequence[TokenSequence] | None = None
    truncate: bool = False

    @property
    def count(self) -> int:
        items = self.texts if self.texts is not None else self.token_ids
        return len(items if items is not None else self.sequences or ())


@dataclass(frozen=True)
class EncoderResult:
    rows: list[dict[str, np.ndarray]]
    prompt_tokens: int


class EncoderServing:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    async def run(
        self,
        model: ModelRuntime,
        inputs: EncoderInputs,
        outputs: Sequence[str],
        timeout_s: float | None = None,
        disconnected: asyncio.Future | None = None,
        priority: int = 0,
    ) -> EncoderResult:
        """Rows of raw outputs (at least `outputs`), one per item, in order.

        Raises InvalidInput naming the field (`inputs[i]`, `input_ids[i]`, `attention_mask`),
        the batcher's errors, or ClientDisconnected.
        """
        self._check_before_work(model, inputs, outputs)
        sequences = await self._sequences(model, inputs)
        tokens = sum(seq.length for seq in sequences)
        if tokens > self._settings.max_tokens_per_request:
            raise InvalidInput(
                _items_field(inputs),
                f"{tokens} tokens; at most {self._settings.max_tokens_per_request} per request",
            )
        self._check_response_size(model, sequences, outputs)
        futures = model.submit(sequences, timeout_s, model.backend_outputs(outputs), priority)
        rows = await _results(futures, disconnected)
        return EncoderResult(rows, tokens)

    def _check_before_work(
        self, model: ModelRuntime, inputs: EncoderInputs, outputs: Sequence[str]
    ) -> None:
        """Bounds that cost nothing to check, checked before tokenizing or copying anything."""
        limits = self._settings
        field = _items_field(inputs)
        if inputs.count == 0:
            raise InvalidInput(field, "the input list is empty")
        if inputs.count > limits.max_items_per_request:
            raise InvalidInput(
                field, f"{inputs.count} items; at most {limits.max_items_per_request} per request"
            )
        model.check_outputs(outputs)
        if inputs.texts is not None:
            for index, text in enumerate(inputs.texts):
                if len(text) > limits.max_chars_per_text:
                    raise InvalidInput(
                        _indexed("inputs", index, inputs.count),
                        f"text has {len(text)} characters; at most {limits.max_chars_per_text}",
                    )
        elif inputs.token_ids is not None:
            longest = max(len(ids) for ids in inputs.token_ids)
            if longest > model.manifest.max_length:
                index = next(i for i, ids in enumerate(inputs.token_ids) if len(ids) == longest)
                raise InvalidInput(
                    _indexed("input_ids", index, inputs.count),
                    f"sequence has {longest} tokens; this model takes at most "
                    f"{model.manifest.max_length}",
                )

    async def _sequences(self, model: ModelRuntime, inputs: EncoderInputs) -> list[TokenSequence]:
        if inputs.sequences is not None:
            return list(inputs.sequences)
        if inputs.texts is not None:
            return await model.tokenizer.encode_async(list(inputs.texts), inputs.truncate)
        assert inputs.token_ids is not None
        masks = inputs.masks
        if masks is not None and len(masks) != len(inputs.token_ids):
            raise InvalidInput(
                "attention_mask",
                f"attention_mask has {len(masks)} items but input_ids has {len(inputs.token_ids)}",
            )
        sequences = []
        for index, ids in enumerate(inputs.token_ids):
            try:
                sequences.append(
                    TokenSequence.from_ids(ids, None if masks is None else masks[index])
                )
            except InvalidInput as exc:
                raise InvalidInput(_indexed(exc.field, index, inputs.count), exc.message) from None
        return sequences

    def _check_response_size(
        self, model: ModelRuntime, sequences: list[TokenSequence], outputs: Sequence[str]
    ) -> None:
        """Refuse before running what would answer with more bytes than the bound allows."""
        tokens = sum(seq.length for seq in sequences)
        floats = sum(
            model.output_width(name)
            * (tokens if model.is_sequence_output(name) else len(sequences))
            for name in outputs
        )
        estimate = floats * JSON_BYTES_PER_FLOAT
        limit = self._settings.max_response_bytes
        if estimate > limit:
            raise InvalidInput(
                "outputs",
                f"the answer would be about {estimate // 2**20} MiB; at most {limit // 2**20} MiB "
                "per response (ask for fewer items or outputs)",
            )


async def _results(
    futures: list[asyncio.Future], disconnected: asyncio.Future | None
) -> list[dict[str, np.ndarray]]:
    """Every future's result; a client that leaves first has its queued items dropped."""

    def drop(_: asyncio.Future) -> None:
        for future in futures:
            future.cancel()

    if disconnected is not None:
        disconnected.add_done_callback(drop)
    try:
        if len(futures) == 1:
            return [await futures[0]]
        return list(await asyncio.gather(*futures))
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if (
            disconnected is not None
            and disconnected.done()
            and not (current and current.cancelling())
        ):
            raise ClientDisconnected() from None
        raise
    finally:
        if disconnected is not None:
            disconnected.remove_done_callback(drop)
        # After one failed, the rest are not worth running: cancelling drops them from the queue.
        drop(disconnected)  # type: ignore[arg-type]


def _items_field(inputs: EncoderInputs) -> str:
    return "inputs" if inputs.texts is not None else "input_ids"


def _indexed(field: str, index: int, count: int) -> str:
    return f"{field}[{index}]" if count > 1 else field
