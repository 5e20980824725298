"""One served plain ONNX graph: its backend and batcher, its signature read from the graph.

The generic beside the token encoder (model_runtime.py): any named tensors in, any out. A graph
whose inputs and outputs all have a dynamic first axis is batched (rows stacked, named dynamic
axes padded together); one with a fixed first axis is served one request at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Unpack, cast

import numpy as np

from ferry.backends import bfloat16
from ferry.backends.onnx_tensors import OnnxTensorBackend
from ferry.backends.options import OnnxRuntimeOptions
from ferry.backends.tensor_signature import Signature
from ferry.batcher import BatchLimits, MicroBatcher, TensorLayout, TensorPacking, TensorRows
from ferry.batcher.tensor_chunks import chunk_rows, join_rows, split_rows
from ferry.batcher.types import InferFn
from ferry.server.encoder import gather_results
from ferry.server.errors import InvalidInput
from ferry.server.graph_model import (
    GRAPH_TASK,
    InferOptions,
    check_chunks,
    class_count,
    graph_limits,
    graph_outputs,
    graph_rows,
    infer_options,
)
from ferry.server.image_inputs import ImageInputs, image_inputs
from ferry.server.metrics import FerryMetrics
from ferry.server.settings import ModelSettings
from ferry.server.unbatched_note import unbatched_note

logger = logging.getLogger(__name__)


class TensorModel:
    """A `GraphModel` run in this process."""

    task = GRAPH_TASK

    def __init__(self, settings: ModelSettings, onnx_file: Path, metrics: FerryMetrics) -> None:
        if not isinstance(settings.backend, OnnxRuntimeOptions):
            raise ValueError(
                f"model {settings.name!r}: a plain ONNX file is served by the onnxruntime "
                f"backend, not {settings.backend.kind}"
            )
        self.settings = settings
        self.name = settings.name
        self.onnx_file = onnx_file
        self.backend = OnnxTensorBackend(onnx_file, settings.backend)
        self._metrics = metrics
        self.batcher: MicroBatcher | None = None
        self.batchable = False
        self._padded: frozenset[str] = frozenset()  # the dynamic axes requests pad along
        self._default_outputs: tuple[str, ...] = ()  # /predict's when a request names none
        self.images: ImageInputs | None = None  # its preprocessing, when it declares one
        self._signature: Signature | None = None  # the graph's, with the image input marked
        self.ready = False

    @property
    def signature(self) -> Signature:
        return self._signature or self.backend.signature

    @property
    def padded_axes(self) -> frozenset[str]:
        """The dynamic axes requests pad along (known once started)."""
        return self._padded

    @property
    def default_outputs(self) -> tuple[str, ...]:
        return self._default_outputs

    @property
    def class_keys(self) -> Mapping[str, list[Any]]:
        """A ZipMap output's classes, in the order of its [N, C] tensor's columns."""
        return self.backend.class_keys

    async def start(self) -> None:
        await self.backend.start()
        self._start_images()
        signature = self.signature
        unknown = set(self.settings.pad_values) - set(signature.input_names)
        if unknown:
            raise ValueError(
                f"model {self.name!r}: pad_values names {sorted(unknown)}, which are not among "
                f"its inputs {list(signature.input_names)}"
            )
        # Only axes the graph names: an unnamed one ties no output to it to cut back.
        named = {a for s in signature.inputs for a in s.named_axes()}
        pad_axes = self.settings.pad_axes
        unknown = set(pad_axes or ()) - named
        if unknown:
            raise ValueError(
                f"model {self.name!r}: pad_axes names {sorted(unknown)}, which are not among "
                f"its inputs' named dynamic axes {sorted(named)}"
            )
        if pad_axes is None and self.images is not None:
            # Decoded images all come out the crop's size; other sizes sent as tensors never
            # share a batch, since padding an image's height or width changes its answers.
            named -= set(signature.input(self.images.input).axis_names().values())
        self._padded = frozenset(named if pad_axes is None else pad_axes)
        self._check_labels()
        if "outputs" in self.settings.model_fields_set:  # else the encoders' default: unset
            missing = set(self.settings.outputs) - set(signature.output_names)
            if missing:
                raise ValueError(
                    f"model {self.name!r}: outputs {sorted(missing)} are not among "
                    f"{list(signature.output_names)}"
                )
            self._default_outputs = self.settings.outputs
        else:
            self._default_outputs = signature.output_names
        self.batchable = signature.batchable
        if (note := unbatched_note(signature)) is not None:
            logger.warning("model %r: %s", self.name, note)
        self.batcher = MicroBatcher(
            self.name,
            cast(InferFn, self.backend.infer),  # a graph's batches are all TensorBatches
            self._limits(),
            None,
            packing=TensorPacking(self._layout()),
            default_timeout_s=self.settings.timeout_s,
            infer_timeout_s=self.settings.infer_timeout_s,
            observer=self._metrics.batch_observer(self.name, self.backend.name),
        )
        self._metrics.queue_capacity.labels(self.name).set(self.settings.batching.max_queue_size)
        self.batcher.start()
        self.ready = True
        self._metrics.model_ready.labels(self.name).set(1)

    def _check_labels(self) -> None:
        for name, labels in self.settings.labels.items():
            if name not in self.signature.output_names:
                raise ValueError(
                    f"model {self.name!r}: labels names {name!r}, which is not among its "
                    f"outputs {list(self.signature.output_names)}"
                )
            classes = class_count(self, name)
            if classes is not None and len(labels) != classes:
                raise ValueError(
                    f"model {self.name!r}: {len(labels)} labels for output {name!r}, "
                    f"which has {classes} classes"
                )

    def _start_images(self) -> None:
        graph = self.backend.signature
        self.images = image_inputs(self.settings, self.backend.metadata, graph)
        if self.images is not None:
            self._signature = replace(graph, images=frozenset({self.images.input}))

    def _layout(self) -> TensorLayout:
        padded = self._padded
        inputs = {
            s.name: {i: a for i, a in s.axis_names().items() if a in padded}
            for s in self.signature.inputs
        }
        outputs = {
            s.name: {i: a for i, a in s.axis_names().items() if a in padded}
            for s in self.signature.outputs
        }
        pad_values = {  # a BF16 input holds bits: its pad value as the bits of that number
            name: int(bfloat16.from_float32(value))
            if self.signature.input(name).datatype == "BF16"
            else value
            for name, value in self.settings.pad_values.items()
        }
        return TensorLayout(inputs, outputs, pad_values, self.batchable)

    def _limits(self) -> BatchLimits:
        return graph_limits(self.settings, self.backend.max_concurrency, self.batchable)

    def validate(self, tensors: Mapping[str, np.ndarray]) -> TensorRows:
        try:
            rows = graph_rows(self.signature, self.batchable, self._padded, tensors)
            self._check_chunks(rows)
        except InvalidInput:
            self.count_invalid()
            raise
        return rows

    def _check_chunks(self, rows: TensorRows) -> None:
        assert self.batcher is not None, "validate before start"
        check_chunks(rows, self.batcher.limits, self.batchable, self.signature)

    def select_outputs(
        self, requested: Sequence[str | None] | None, *, tensors: bool = False
    ) -> tuple[str, ...]:
        return graph_outputs(self.signature, self._default_outputs, requested, tensors)

    async def infer(
        self, rows: TensorRows, outputs: Sequence[str], **options: Unpack[InferOptions]
    ) -> dict[str, np.ndarray]:
        """A validated request's outputs, its rows on the first axis, through the batcher; one
        of more rows than a batch takes goes in chunks (tensor_chunks.py)."""
        timeout_s, priority, disconnected = infer_options(options)
        assert self.batcher is not None, "infer before start"
        whole = rows.rows == 1 or not self.batchable  # a row is never split
        chunks = [rows] if whole else split_rows(rows, chunk_rows(rows, self.batcher.limits))
        futures = self.batcher.submit(chunks, timeout_s, frozenset(outputs), priority)
        return join_rows(await gather_results(futures, disconnected))

    def count_invalid(self) -> None:
        self._metrics.rejections.labels(self.name, "invalid").inc()

    async def healthy(self) -> bool:
        ok = self.ready and await self.backend.health()
        self._metrics.model_ready.labels(self.name).set(1 if ok else 0)
        return ok

    async def close(self, drain_timeout_s: float) -> None:
        self.ready = False
        self._metrics.model_ready.labels(self.name).set(0)
        if self.batcher is not None:
            await self.batcher.close(drain_timeout_s)
        if self.images is not None:
            self.images.close()
        await self.backend.close()
