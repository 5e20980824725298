"""A token model as KServe sees every model: a graph whose preprocessing is a tokenizer.

Its signature is what a request may send (token ids INT64 [batch, seq], INT32 widened, with an
optional mask and segment ids, or UTF-8 `text`) and what it answers (FP32: one vector a row, or
one a token for sequence outputs); `infer` goes through the encoder path (tokenizing the text,
the model's batcher), as /predict and /v1/embeddings do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, Unpack

import numpy as np

from ferry.backends.tensor_signature import Signature, TensorSpec
from ferry.server.encoder import EncoderServing
from ferry.server.encoder_model import EncoderModel
from ferry.server.errors import InvalidInput
from ferry.server.graph_model import InferOptions, infer_options, refuse_sequence
from ferry.server.kserve.infer import infer_tensors
from ferry.server.kserve.kserve_model import ModelView, Scores
from ferry.server.kserve.model_config import (
    TEXT_INPUT,
    TOKEN_INPUTS,
    TYPES_INPUT,
    token_config,
    token_metadata,
)

ROWS, TOKENS = "batch", "sequence"  # the names of a token model's dynamic axes
IDS_ALSO = frozenset({"INT32"})  # token ids sent as INT32 (tritonclient's examples), widened


class TokenGraph(ModelView[EncoderModel]):
    def __init__(self, model: EncoderModel, encoder: EncoderServing) -> None:
        super().__init__(model)
        self.encoder = encoder

    @cached_property  # read several times a request; the view lives for one
    def signature(self) -> Signature:
        # Segment ids are taken from every client (all zeros change nothing); the metadata lists
        # them only for the models whose graph reads them.
        names = (*TOKEN_INPUTS, TYPES_INPUT)
        tokens = (TensorSpec(n, "INT64", (ROWS, TOKENS), widens=IDS_ALSO) for n in names)
        text = TensorSpec(TEXT_INPUT, "BYTES", (ROWS, 1))
        sequences = self.model.backend.sequence_outputs
        outputs = (
            TensorSpec(n, "FP32", (ROWS, TOKENS, f"{n}:2") if n in sequences else (ROWS, f"{n}:1"))
            for n in self.model.backend.output_names
        )
        return Signature((*tokens, text), tuple(outputs))

    @property
    def rows_first(self) -> bool:
        return True

    def output_names(self, requested: Sequence[str | None]) -> tuple[str, ...]:
        return self.model.outputs.select(requested, tensors=True)

    def scores(self, name: str) -> Scores:
        outputs = self.model.outputs
        if outputs.is_sequence(name):
            raise InvalidInput(
                name, "classification needs one vector of scores a row, not a sequence"
            )
        id2label = self.model.manifest.id2label if name == "logits" else {}
        width = outputs.width(name)
        labels = tuple(id2label.get(i, str(i)) for i in range(width)) if id2label else None
        return Scores("FP32", width, labels, True)

    def metadata(self) -> dict[str, Any]:
        return token_metadata(self.model)

    def config(self) -> dict[str, Any]:
        return token_config(self.model)

    async def sync_classes(self) -> None:
        pass  # its classes are its manifest's, known at start

    async def infer(
        self,
        tensors: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        **options: Unpack[InferOptions],
    ) -> dict[str, np.ndarray]:
        refuse_sequence(self.name, options)
        _, priority, disconnected = infer_options(options)
        return await infer_tensors(
            self.model, self.encoder, dict(tensors), outputs, disconnected, priority
        )
