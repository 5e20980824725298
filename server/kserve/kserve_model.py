"""Every model as KServe sees it (Triton's idea): a signature that each transport decodes a
request by, once, outputs it selects and classifies by, its metadata and configuration, and an
`infer` from decoded tensors to output tensors.

A plain graph is one as it stands (`GraphView`); a token model is a graph whose preprocessing is
a tokenizer (`TokenGraph`, token_graph.py). The routes and the gRPC service never ask which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, Unpack

import numpy as np

from ferry.backends.tensor_signature import Signature
from ferry.server.graph_model import (
    GraphModel,
    InferOptions,
    class_count,
    class_labels,
    prepare,
    rows_first,
)
from ferry.server.kserve.tensor_config import tensor_config, tensor_metadata
from ferry.server.model_outputs import distinct
from ferry.server.served_model import ServedModel


@dataclass(frozen=True)
class Scores:
    """What classification reads of an output: its datatype, its classes per row (None: not
    known before it runs), their labels, and whether it holds one vector of scores a row."""

    datatype: str
    classes: int | None
    labels: tuple[str, ...] | None
    batched: bool


class KServeModel(Protocol):
    @property
    def signature(self) -> Signature:
        """What a request's tensors are decoded by, and the datatypes of its outputs."""

    def output_names(self, requested: Sequence[str | None]) -> tuple[str, ...]:
        """The requested outputs, checked (each once); every output when none is named."""

    @property
    def rows_first(self) -> bool:
        """Its rows on axis 0, as Triton batches (a raw request's batch of one)."""

    @property
    def name(self) -> str: ...

    def scores(self, name: str) -> Scores:
        """Output `name` as classification reads it (InvalidInput where it holds none)."""

    def metadata(self) -> dict[str, Any]: ...
    def config(self) -> dict[str, Any]:
        """Triton's model configuration JSON."""

    async def sync_classes(self) -> None:
        """Every class its answers taught it so far known here (metadata and config list
        them)."""

    async def healthy(self) -> bool: ...

    async def infer(
        self,
        tensors: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        **options: Unpack[InferOptions],
    ) -> dict[str, np.ndarray]:
        """A request's decoded tensors -> its outputs (in the order asked for): validated
        first (InvalidInput naming the input), then through the model's batcher."""


M = TypeVar("M", bound=ServedModel)


class ModelView(Generic[M]):
    """What a served model answers as it is: its name and health."""

    def __init__(self, model: M) -> None:
        self.model = model

    @property
    def name(self) -> str:
        return self.model.name

    async def healthy(self) -> bool:
        return await self.model.healthy()


class GraphView(ModelView[GraphModel]):
    """A plain graph as KServe sees it: its own signature, outputs and datatypes."""

    @property
    def signature(self) -> Signature:
        return self.model.signature

    @property
    def rows_first(self) -> bool:
        return rows_first(self.model)

    def output_names(self, requested: Sequence[str | None]) -> tuple[str, ...]:
        return distinct(self.model.select_outputs(requested, tensors=True))

    def scores(self, name: str) -> Scores:
        spec = self.model.signature.output(name)
        batched = rows_first(self.model) or spec.class_map
        model = self.model
        return Scores(spec.datatype, class_count(model, name), class_labels(model, name), batched)

    def metadata(self) -> dict[str, Any]:
        return tensor_metadata(self.model)

    def config(self) -> dict[str, Any]:
        return tensor_config(self.model)

    async def sync_classes(self) -> None:
        await self.model.sync_classes()

    async def infer(
        self,
        tensors: Mapping[str, np.ndarray],
        outputs: Sequence[str],
        **options: Unpack[InferOptions],
    ) -> dict[str, np.ndarray]:
        rows = await prepare(self.model, tensors)
        result = await self.model.infer(rows, outputs, **options)
        return {name: result[name] for name in outputs}
