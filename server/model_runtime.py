"""One served model: its tokenizer, backend and batcher, started and stopped together."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np

from ferry.backends.base import Backend
from ferry.backends.hf_folder import folder_manifest
from ferry.backends.manifest import ModelManifest
from ferry.batcher import MicroBatcher, PaddedBatch, SequenceLimits, TokenSequence
from ferry.batcher.types import InferFn, Result
from ferry.server.encoder_request import ValidSequences
from ferry.server.errors import InvalidInput
from ferry.server.metrics import FerryMetrics
from ferry.server.settings import ModelSettings
from ferry.server.tokenization import TextTokenizer

logger = logging.getLogger(__name__)

# A deadline under this share of one row's predicted time is refused as one that cannot be met.
DEADLINE_FLOOR_SHARE = 0.5
# Outputs computed from `logits` (not the backend's own): a classifier's label and softmax,
# or a one-logit head's (a cross-encoder's) sigmoid, where a softmax would always be 1.0.
CLASS_OUTPUTS = ("label", "probabilities")
SCORE_OUTPUTS = ("score",)
DERIVED_OUTPUTS = (*CLASS_OUTPUTS, *SCORE_OUTPUTS)
HEAD_TASKS = ("classification", "rerank")


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
        # ferry_model.json, else what a Hugging Face config.json beside the model says (a folder
        # served by `torch`, or an optimum export); the error names the files looked for.
        self.manifest: ModelManifest = folder_manifest(settings.path)
        self.tokenizer = TextTokenizer(settings.path / "tokenizer.json", self.manifest.max_length)
        self.backend = self._build_backend(settings)
        self._metrics = metrics
        self.batcher: MicroBatcher | None = None
        # Floats per item (pooled) or per token (sequence outputs), learned at start.
        self._widths: dict[str, int] = {}
        self.ready = False

    def _build_backend(self, settings: ModelSettings) -> Backend:
        # An API process's stand-in (server/procs/remote.py) has no backend of its own.
        return build_backend(settings)

    async def start(self) -> None:
        await self.backend.start()
        await self._learn_output_widths()  # a head's width decides its derived outputs
        unknown = set(self.default_outputs) - set(self.servable_outputs)
        if unknown:
            raise ValueError(
                f"model {self.name!r}: outputs {sorted(unknown)} are not among "
                f"{list(self.servable_outputs)}"
            )
        self.batcher = MicroBatcher(
            self.name,
            cast(InferFn, self.backend.infer),  # a token model's batches are all PaddedBatches
            # The backend knows how many batches may run at once (measured when auto).
            replace(
                self.settings.batching,
                max_concurrent_batches=self.backend.max_concurrency,
                prepared_batches=1 if self.backend.queues_batches else 0,
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

    @property
    def scores(self) -> bool:
        """A one-logit head (a cross-encoder): it answers a score, not a class."""
        return self.manifest.task in HEAD_TASKS and self._widths.get("logits") == 1

    @property
    def takes_token_types(self) -> bool:
        return self.backend.takes_token_types

    @property
    def servable_outputs(self) -> tuple[str, ...]:
        names = self.backend.output_names
        if self.manifest.task in HEAD_TASKS and "logits" in names:
            return (*names, *(SCORE_OUTPUTS if self.scores else CLASS_OUTPUTS))
        return names

    @property
    def default_outputs(self) -> tuple[str, ...]:
        """The configured outputs; a head's derived ones when the config names none."""
        if "outputs" in self.settings.model_fields_set or self.manifest.task not in HEAD_TASKS:
            return self.settings.outputs
        return SCORE_OUTPUTS if self.scores else CLASS_OUTPUTS

    async def _learn_output_widths(self) -> None:
        ids = np.ones((1, 2), dtype=np.int64)
        outputs = await self.backend.infer(PaddedBatch(ids, ids, (2,)))
        for name, value in outputs.items():
            inner = value.shape[2:] if name in self.backend.sequence_outputs else value.shape[1:]
            self._widths[name] = int(np.prod(inner))
        if "logits" in self._widths:
            self._widths["label"] = 1
            self._widths["probabilities"] = 2 * self._widths["logits"]
            self._widths["score"] = 1

    def output_width(self, name: str) -> int:
        return self._widths.get(name, 1)

    def is_sequence_output(self, name: str) -> bool:
        return name in self.backend.sequence_outputs

    async def healthy(self) -> bool:
        ok = self.ready and await self.backend.health()
        self._metrics.model_ready.labels(self.name).set(1 if ok else 0)
        return ok

    def submit(self, valid: ValidSequences) -> list[asyncio.Future[Result]]:
        """Queue a validated request's rows (nothing is checked again), one future each."""
        return self.submit_rows(
            valid.sequences(), valid.timeout_s, self.backend_outputs(valid.outputs), valid.priority
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

    def check_deadline(self, longest: int, timeout_s: float) -> None:
        """A deadline shorter than the model's time for the longest row alone, on an idle
        server, can never be met: a 422 naming timeout_ms before queueing, not a 504 after.
        Only under half that time, since the cost model is fitted on a shared machine."""
        cost_model = self.batcher.cost_model  # type: ignore[union-attr]  # started before any request
        if not cost_model.ready:
            return
        floor_s = cost_model.predict(1, longest) * DEADLINE_FLOOR_SHARE
        if timeout_s < floor_s:
            raise InvalidInput(
                "timeout_ms",
                f"{timeout_s * 1000:g} ms cannot be met: this model needs about "
                f"{floor_s / DEADLINE_FLOOR_SHARE * 1000:.1f} ms for one row of {longest} tokens "
                "on an idle server",
            )

    def count_invalid(self) -> None:
        """A request refused by validation, counted with the batcher's own refusals."""
        self._metrics.rejections.labels(self.name, "invalid").inc()

    def select_outputs(
        self, requested: Sequence[str | None] | None, *, tensors: bool = False
    ) -> tuple[str, ...]:
        """The outputs a request wants, checked (the one check of output names): the ones it
        names, else the configured ones. `tensors` (KServe): only the backend's own outputs,
        all of them by default, since the derived ones are no FP32 tensors."""
        choices = self.backend.output_names if tensors else self.servable_outputs
        for name in requested or ():
            if name not in choices:
                raise InvalidInput(
                    "outputs", f"unknown output {name!r}; choose from {list(choices)}"
                )
        if requested:
            return tuple(requested)  # type: ignore[arg-type]  # each name checked above: no None
        return tuple(choices) if tensors else self.default_outputs

    def backend_outputs(self, names: Sequence[str]) -> frozenset[str]:
        """What the backend must fetch for `names`: derived outputs come from the logits."""
        return frozenset("logits" if name in DERIVED_OUTPUTS else name for name in names)

    def render(self, row: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
        """One request's raw outputs -> the JSON-ready values it asked for."""
        rendered: dict[str, Any] = {}
        if self.scores and "logits" in row:
            row = {**row, "score": sigmoid(float(row["logits"][0]))}
        elif self.manifest.task in HEAD_TASKS and "logits" in row:
            logits = row["logits"].astype(np.float64)
            exp = np.exp(logits - logits.max())
            probabilities = exp / exp.sum()
            labels = [self.manifest.id2label.get(i, str(i)) for i in range(len(probabilities))]
            derived = {
                "label": labels[int(np.argmax(probabilities))],
                "probabilities": dict(zip(labels, probabilities.tolist(), strict=True)),
            }
            row = {**row, **derived}
        for name in outputs:
            rendered[name] = row[name]  # arrays stay arrays: the JSON encoder writes them
        return rendered

    async def close(self, drain_timeout_s: float) -> None:
        self.ready = False
        self._metrics.model_ready.labels(self.name).set(0)
        if self.batcher is not None:
            await self.batcher.close(drain_timeout_s)
        await self.backend.close()
        self.tokenizer.close()


def sigmoid(logit: float) -> float:
    """A one-logit head's probability (TEI's and vLLM's score for a cross-encoder)."""
    return 0.5 * (1.0 + math.tanh(logit / 2))  # no overflow for any logit
