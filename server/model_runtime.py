"""One served model: its tokenizer, backend and batcher, started and stopped together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

import numpy as np

from ferry.backends.base import Backend
from ferry.backends.batch_plan import neighbour_dependent_nodes
from ferry.backends.onnx_graph_ops import read_graph_ops
from ferry.batcher import MicroBatcher, PaddedBatch, SequenceLimits, TokenSequence
from ferry.batcher.cost_model import RowTime
from ferry.batcher.types import InferFn, Result
from ferry.server.deadline_floor import refuse_unmeetable
from ferry.server.encoder_request import ValidSequences
from ferry.server.metrics import FerryMetrics
from ferry.server.model_files import token_model_files
from ferry.server.model_outputs import ModelOutputs
from ferry.server.settings import ModelSettings

logger = logging.getLogger(__name__)


def build_backend(settings: ModelSettings) -> Backend:
    options = settings.backend
    if options.kind == "triton":
        from ferry.backends.triton import (
            TritonBackend,  # tritonclient is only needed for this backend
        )

        return TritonBackend.from_options(
            options,
            name=settings.name,
            infer_timeout_s=settings.infer_timeout_s,
            max_batch_size=settings.batching.max_batch_size,
        )
    if options.kind == "torch":
        from ferry.backends.torch_backend import TorchBackend  # imports torch only when chosen

        return TorchBackend.from_options(settings.path, options)
    from ferry.backends.onnxruntime import OnnxRuntimeBackend

    model_file = settings.path / "model.onnx"
    if not model_file.is_file():
        raise FileNotFoundError(f"model {settings.name!r}: model file not found: {model_file}")
    # Its takes_token_types is a read-only property; the protocol's reader is all Ferry uses.
    return cast(Backend, OnnxRuntimeBackend.from_options(model_file, options))


class ModelRuntime:
    def __init__(self, settings: ModelSettings, metrics: FerryMetrics) -> None:
        self.settings = settings
        self.name = settings.name
        self.manifest, self.tokenizer = token_model_files(settings)
        self.backend = build_backend(settings)
        self._metrics = metrics
        self.batcher: MicroBatcher | None = None
        # Its widths are learned at start: until then, none.
        self.outputs = ModelOutputs(settings, self.manifest, self.backend, {})
        self.ready = False

    async def start(self) -> None:
        await self.backend.start()
        # A head's width decides its derived outputs.
        self.outputs = replace(self.outputs, widths=await self._learn_output_widths())
        unknown = set(self.outputs.defaults) - set(self.outputs.servable)
        if unknown:
            raise ValueError(
                f"model {self.name!r}: outputs {sorted(unknown)} are not among "
                f"{list(self.outputs.servable)}"
            )
        self.batcher = MicroBatcher(
            self.name,
            cast(InferFn, self.backend.infer),  # a token model's batches are all PaddedBatches
            # The backend knows how many batches may run at once (measured when auto).
            replace(
                self.settings.batching,
                max_concurrent_batches=self.backend.max_concurrency,
                prepared_batches=1 if self.backend.queues_batches else 0,
                max_batch_size=self._max_batch_size(),
            ),
            SequenceLimits(self.manifest.max_length, self.manifest.vocab_size),
            sequence_outputs=self.backend.sequence_outputs,
            pad_token_id=self.manifest.pad_token_id,
            default_timeout_s=self.settings.timeout_s,
            infer_timeout_s=self.settings.infer_timeout_s,
            observer=self._metrics.batch_observer(self.name, self.backend.name),
        )
        self._metrics.queue_capacity.labels(self.name).set(self.settings.batching.max_queue_size)
        await self.batcher.calibrate()
        self.batcher.start()
        self.ready = True
        self._metrics.model_ready.labels(self.name).set(1)

    def _max_batch_size(self) -> int:
        """1 for a graph whose nodes mix rows (`ferry export optimize --precision int8`'s
        dynamic quantization: one scale for the whole batch), unless the config accepts it."""
        configured = self.settings.batching.max_batch_size
        model_file = self.settings.path / "model.onnx"
        if self.settings.accept_neighbour_dependence or not model_file.is_file():
            return configured  # another backend's folder (torch, Triton)
        mixing = neighbour_dependent_nodes(read_graph_ops(model_file))
        if not mixing:
            return configured
        logger.warning(
            "model %r: one request at a time: node %s computes across rows, so an answer would "
            "depend on its neighbours; accept_neighbour_dependence = true batches it anyway",
            self.name,
            mixing[0],
        )
        return 1

    async def _learn_output_widths(self) -> dict[str, int]:
        ids = np.ones((1, 2), dtype=np.int64)
        outputs = await self.backend.infer(PaddedBatch(ids, ids, (2,)))
        widths: dict[str, int] = {}
        for name, value in outputs.items():
            inner = value.shape[2:] if name in self.backend.sequence_outputs else value.shape[1:]
            widths[name] = int(np.prod(inner))
        if "logits" in widths:
            widths["label"] = 1
            widths["probabilities"] = 2 * widths["logits"]
            widths["score"] = 1
        return widths

    async def healthy(self) -> bool:
        ok = self.ready and await self.backend.health()
        self._metrics.model_ready.labels(self.name).set(1 if ok else 0)
        return ok

    def submit(self, valid: ValidSequences) -> list[asyncio.Future[Result]]:
        """Queue a validated request's rows (nothing is checked again), one future each."""
        return self.submit_rows(
            valid.sequences(),
            valid.timeout_s,
            self.outputs.for_backend(valid.outputs),
            valid.priority,
        )

    def submit_rows(
        self,
        sequences: Sequence[TokenSequence],
        timeout_s: float | None,
        outputs: frozenset[str] | None,
        priority: int,
    ) -> list[asyncio.Future[Result]]:
        """The rows of a validated request (here, or from an API process), one future each."""
        assert self.batcher is not None, "submit before start"
        return self.batcher.submit(sequences, timeout_s, outputs, priority)

    def fastest_row(self) -> RowTime | None:
        """One row's time on an idle server, once the cost model is fitted."""
        cost_model = self.batcher.cost_model  # type: ignore[union-attr]  # started before any request
        return cost_model.fastest_row() if cost_model.ready else None

    def check_deadline(self, longest: int, timeout_s: float) -> None:
        refuse_unmeetable(self.fastest_row(), longest, timeout_s)

    def count_invalid(self) -> None:
        """A request refused by validation, counted with the batcher's own refusals."""
        self._metrics.rejections.labels(self.name, "invalid").inc()

    async def close(self, drain_timeout_s: float) -> None:
        self.ready = False
        self._metrics.model_ready.labels(self.name).set(0)
        if self.batcher is not None:
            await self.batcher.close(drain_timeout_s)
        await self.backend.close()
        self.tokenizer.close()
