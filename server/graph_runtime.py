"""One served plain ONNX graph: its backend and batcher, its signature read from the graph.

The generic beside the token encoder (model_runtime.py): any named tensors in, any out. How its
requests share batches (rows stacked, which axes pad, or one request at a time) is decided at
start from its signature and nodes (backends/batch_plan.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Unpack, cast

import numpy as np

from ferry.backends import bfloat16
from ferry.backends.batch_plan import UNSTARTED, BatchPlan, plan_batching
from ferry.backends.onnx_graph_ops import GraphOps, MalformedGraph, read_graph_ops
from ferry.backends.onnx_tensors import OnnxTensorBackend
from ferry.backends.options import OnnxRuntimeOptions
from ferry.backends.tensor_signature import Signature
from ferry.batcher import (
    BatchLimits,
    MicroBatcher,
    TensorBatch,
    TensorLayout,
    TensorPacking,
    TensorRows,
)
from ferry.batcher.tensor_chunks import chunk_rows, join_rows, split_rows
from ferry.batcher.types import InferFn
from ferry.server.encoder import gather_results
from ferry.server.errors import InvalidInput
from ferry.server.graph_model import (
    GRAPH_TASK,
    InferOptions,
    check_chunks,
    check_one_row,
    check_sequence_names,
    class_count,
    graph_limits,
    graph_outputs,
    graph_values,
    infer_options,
    plan_rows,
    refuse_sequence,
)
from ferry.server.image_inputs import ImageInputs, image_inputs
from ferry.server.light_graphs import light_ops
from ferry.server.metrics import FerryMetrics
from ferry.server.sequences import SequenceBatcher
from ferry.server.settings import ModelSettings

logger = logging.getLogger(__name__)


class GraphRuntime:
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
        self._graph: Signature | None = None  # the graph's, with the image input marked
        self._signature: Signature | None = None  # what clients send: without filled inputs
        self.sequences: SequenceBatcher | None = None  # a stateful graph's (sequences.py)
        self.batch_plan = UNSTARTED  # decided at start (backends/batch_plan.py)
        self.ready = False

    @property
    def signature(self) -> Signature:
        """What clients see and send: the graph's, less the inputs the server fills."""
        return self._signature or self.graph_signature

    @property
    def graph_signature(self) -> Signature:
        """The graph's own (what its batches hold), with the image input marked."""
        return self._graph or self.backend.signature

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

    async def sync_classes(self) -> None:
        pass  # the graph runs here: its answers taught it

    async def start(self) -> None:
        await self.backend.start()
        self._start_images()
        self._start_sequences()
        signature = self.graph_signature
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
        unknown = set(self.settings.mask_inputs or ()) - set(signature.input_names)
        if unknown:
            raise ValueError(
                f"model {self.name!r}: mask_inputs names {sorted(unknown)}, which are not among "
                f"its inputs {list(signature.input_names)}"
            )
        ops = self._graph_ops()
        self.batch_plan = self._plan(ops)
        if ops is not None and light_ops(ops.op_types()):
            self.backend.run_small_batches_on_loop()
        self._padded = self.batch_plan.padded
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
        self.batchable = self.batch_plan.batched
        run = self._run_rows_moved if self.batch_plan.rows_axes else self.backend.infer
        self.batcher = MicroBatcher(
            self.name,
            cast(InferFn, run),  # a graph's batches are all TensorBatches
            self._limits(),
            None,
            packing=TensorPacking(self._layout()),
            default_timeout_s=self.settings.timeout_s,
            infer_timeout_s=self.settings.infer_timeout_s,
            observer=self._metrics.batch_observer(self.name, self.backend.name),
        )
        self._metrics.queue_capacity.labels(self.name).set(self.settings.batching.max_queue_size)
        self.batcher.start()
        if self.sequences is not None:
            self.sequences.start()
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

    def _graph_ops(self) -> GraphOps | None:
        try:
            return read_graph_ops(self.onnx_file)
        except (OSError, MalformedGraph) as exc:  # ONNX Runtime read it: only detection is lost
            logger.warning("model %r: its nodes could not be read (%s)", self.name, exc)
            return None

    def _plan(self, ops: GraphOps | None) -> BatchPlan:
        settings = self.settings
        # Decoded images all come out the crop's size; other sizes sent as tensors never share
        # a batch, since padding an image's height or width changes its answers.
        images = self.signature.input(self.images.input) if self.images is not None else None
        plan = plan_batching(
            self.graph_signature,
            ops,
            pad_axes=settings.pad_axes,
            mask_inputs=settings.mask_inputs,
            batch_axis=settings.batch_axis,
            accept_neighbour_dependence=settings.accept_neighbour_dependence,
            unpaddable=images.axis_names().values() if images is not None else (),
        )
        log = logger.info if plan.batched else logger.warning
        log("model %r: %s", self.name, plan.summary())
        for rule in plan.axes:
            logger.info("model %r: %s", self.name, rule.line())
        return plan

    def _start_images(self) -> None:
        graph = self.backend.signature
        self.images = image_inputs(self.settings, self.backend.metadata, graph)
        if self.images is not None:
            self._graph = replace(graph, images=frozenset({self.images.input}))

    def _start_sequences(self) -> None:
        """A stateful graph's sequence batcher; clients then see the graph without the inputs
        it fills."""
        config = self.settings.sequence_batching
        if config is None:
            return
        if self.images is not None:
            # Decoding images suspends before a request is admitted to its sequence, which
            # would let a gRPC stream's requests overtake each other (server/sequences.py).
            raise ValueError(f"model {self.name!r}: sequence_batching takes no preprocess")
        graph = self.graph_signature
        check_sequence_names(self.name, config, graph, self.settings.batch_axis)
        limits = self.settings.batching
        per_session = limits.max_batch_size if graph.batchable else 1
        if config.strategy == "oldest" and config.max_candidate_sequences is not None:
            per_session = config.max_candidate_sequences
        slots = per_session * self.backend.max_concurrency
        self.sequences = SequenceBatcher(self.name, config, graph, slots)
        filled = self.sequences.filled_inputs
        self._signature = replace(
            graph, inputs=tuple(s for s in graph.inputs if s.name not in filled)
        )

    async def _run_rows_moved(self, batch: TensorBatch) -> dict[str, np.ndarray]:
        """A batch stacked along axis 0, run in the graph's layout (batch_axis > 0)."""
        inputs = graph_values(self.batch_plan, batch.inputs, into_batch=False)
        values = await self.backend.infer(replace(batch, inputs=inputs))
        return graph_values(self.batch_plan, values, into_batch=True)

    def _layout(self) -> TensorLayout:
        padded = self._padded
        signature = self.batch_plan.rows_signature or self.graph_signature  # rows first
        inputs = {
            s.name: {i: a for i, a in s.axis_names().items() if a in padded}
            for s in signature.inputs
        }
        outputs = {
            s.name: {i: a for i, a in s.axis_names().items() if a in padded}
            for s in signature.outputs
        }
        pad_values = {  # a BF16 input holds bits: its pad value as the bits of that number
            name: int(bfloat16.from_float32(value))
            if self.graph_signature.input(name).datatype == "BF16"
            else value
            for name, value in self.settings.pad_values.items()
        }
        return TensorLayout(inputs, outputs, pad_values, self.batchable)

    def _limits(self) -> BatchLimits:
        return graph_limits(self.settings, self.backend.max_concurrency, self.batchable)

    def validate(self, tensors: Mapping[str, np.ndarray]) -> TensorRows:
        try:
            rows = plan_rows(self.signature, self.batch_plan, tensors)
            if self.sequences is not None:
                check_one_row(self.name, rows, self.batchable)
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
        if self.sequences is None:
            refuse_sequence(self.name, options)
        else:  # admitted here, before any suspension: arrival order is the sequence's order
            turn = self.sequences.admit(options.get("sequence"))

            async def run(tensors: Mapping[str, np.ndarray], wanted: tuple[str, ...]) -> Any:
                filled = plan_rows(self.graph_signature, self.batch_plan, tensors)
                return await self._infer_rows(filled, wanted, timeout_s, priority, disconnected)

            deadline = self.settings.timeout_s if timeout_s is None else timeout_s
            return await self.sequences.run(turn, rows.tensors, tuple(outputs), deadline, run)
        return await self._infer_rows(rows, outputs, timeout_s, priority, disconnected)

    async def _infer_rows(
        self,
        rows: TensorRows,
        outputs: Sequence[str],
        timeout_s: float | None,
        priority: int,
        disconnected: asyncio.Future[None] | None,
    ) -> dict[str, np.ndarray]:
        futures = self.submit_rows(rows, outputs, timeout_s, priority)
        return self.rows_answer(await gather_results(futures, disconnected))

    def submit_rows(
        self, rows: TensorRows, outputs: Sequence[str], timeout_s: float | None, priority: int
    ) -> list[asyncio.Future[dict[str, np.ndarray]]]:
        """A validated request queued: one future per chunk (a row is never split). Raises the
        batcher's refusals at once."""
        assert self.batcher is not None, "infer before start"
        whole = rows.rows == 1 or not self.batchable
        chunks = [rows] if whole else split_rows(rows, chunk_rows(rows, self.batcher.limits))
        return self.batcher.submit(chunks, timeout_s, frozenset(outputs), priority)

    def rows_answer(self, results: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The chunks' results, in order, as the request's outputs in the graph's layout."""
        return graph_values(self.batch_plan, join_rows(results), into_batch=False)

    def count_invalid(self) -> None:
        self._metrics.rejections.labels(self.name, "invalid").inc()

    async def healthy(self) -> bool:
        ok = self.ready and await self.backend.health()
        self._metrics.model_ready.labels(self.name).set(1 if ok else 0)
        return ok

    async def close(self, drain_timeout_s: float) -> None:
        self.ready = False
        if self.sequences is not None:
            await self.sequences.close()
        self._metrics.model_ready.labels(self.name).set(0)
        if self.batcher is not None:
            await self.batcher.close(drain_timeout_s)
        if self.images is not None:
            self.images.close()
        await self.backend.close()
