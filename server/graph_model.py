"""What the server uses of a plain ONNX graph: the routes, KServe and the registry see only this.
`GraphRuntime` (graph_runtime.py) runs the graph in this process; in an API process
`RemoteGraph` (procs/remote.py) forwards validated rows to the engine process's.

The request rules both apply alike (which rows a request holds, which outputs it gets) are here,
so an API process decides a request's 4xx exactly as the engine process would.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypedDict, Unpack

import numpy as np

from ferry.backends.batch_plan import BatchPlan
from ferry.backends.tensor_signature import Signature
from ferry.batcher import BatchLimits, TensorRows
from ferry.batcher.admission import request_places
from ferry.batcher.tensor_chunks import chunk_rows
from ferry.server.errors import InvalidInput
from ferry.server.image_inputs import ImageInputs
from ferry.server.sequences import SEQUENCE_ID, SequenceFlags
from ferry.server.served_model import ServedModel
from ferry.server.settings import ModelSettings, SequenceBatching
from ferry.server.tensor_inputs import valid_rows


class GraphBackend(Protocol):
    """What KServe's model config reads of the backend."""

    @property
    def name(self) -> str: ...
    @property
    def max_concurrency(self) -> int: ...


class GraphModel(ServedModel, Protocol):
    """A plain graph (`EncoderModel`s are token models; KServe sees both as graphs:
    kserve/kserve_model.py)."""

    task: str  # GRAPH_TASK, as /v1/models lists it

    @property
    def backend(self) -> GraphBackend: ...
    @property
    def signature(self) -> Signature:
        """What clients send and see (without the inputs a sequence batcher fills)."""

    @property
    def graph_signature(self) -> Signature:
        """The graph's own: every input its batches hold."""

    @property
    def class_keys(self) -> Mapping[str, list[Any]]:
        """A ZipMap output's classes, in the order of its [N, C] tensor's columns."""

    async def sync_classes(self) -> None:
        """`class_keys` made to hold every class an answer taught the graph so far, wherever
        it ran (in an API process: what the engine told it before its reply to another)."""

    @property
    def batchable(self) -> bool: ...
    @property
    def batch_plan(self) -> BatchPlan:
        """How its requests share batches, per axis and why (backends/batch_plan.py)."""

    @property
    def images(self) -> ImageInputs | None:
        """Its image preprocessing, where it declares one (decoded where requests arrive)."""

    def validate(self, tensors: Mapping[str, np.ndarray]) -> TensorRows:
        """A request's tensors checked against the signature (InvalidInput naming the input)."""

    def select_outputs(
        self, requested: Sequence[str | None] | None, *, tensors: bool = False
    ) -> tuple[str, ...]: ...

    async def infer(
        self, rows: TensorRows, outputs: Sequence[str], **options: Unpack[InferOptions]
    ) -> dict[str, np.ndarray]:
        """A validated request's outputs, its rows on the first axis (nothing checked again)."""


GRAPH_TASK = "tensor"


# The batch limit in elements when the config keeps the token default (2048 suits tokens, not
# a row of 30 features or an image of 150,528 values): about 16 MB of FP32 a batch.
TENSOR_BATCH_ELEMENTS = 4 * 2**20


def graph_limits(settings: ModelSettings, max_concurrency: int, batchable: bool) -> BatchLimits:
    """The graph's batcher limits: the configured ones, in rows and elements."""
    limits = settings.batching
    elements = limits.max_batch_tokens
    if elements == BatchLimits().max_batch_tokens:
        elements = TENSOR_BATCH_ELEMENTS
    return replace(
        limits,
        max_concurrent_batches=max_concurrency,
        prepared_batches=0,
        # A fixed first axis: the graph takes one request's rows at a time.
        max_batch_size=limits.max_batch_size if batchable else 1,
        max_batch_tokens=elements,
    )


def check_chunks(
    rows: TensorRows, limits: BatchLimits, batchable: bool, signature: Signature
) -> None:
    """A request whose chunks the queue could never hold at once is refused (not a 429 that no
    retry would lift)."""
    if rows.rows == 1:  # a row is never split
        return
    size = chunk_rows(rows, limits)
    places = request_places(limits)  # a share of the queue: the rest is for other requests
    if batchable and math.ceil(rows.rows / size) > places:
        raise InvalidInput(
            signature.input_names[0],
            f"{rows.rows} rows go in chunks of {size}, more than the {places} places one "
            f"request may take of the queue's {limits.max_queue_size} (at most "
            f"{places * size} rows)",
        )


class InferOptions(TypedDict, total=False):
    """infer()'s optional keywords, declared once for the protocol and both models
    (`infer_options` gives each with its default): the request's deadline (None: the model's
    `timeout_s`), its priority, and a future the client's disconnect resolves."""

    timeout_s: float | None
    priority: int
    disconnected: asyncio.Future[None] | None
    sequence: SequenceFlags | None  # its place in a sequence (a stateful graph's)


def infer_options(
    options: InferOptions,
) -> tuple[float | None, int, asyncio.Future[None] | None]:
    """(timeout_s, priority, disconnected) of an infer() call, defaults where it gave none."""
    return options.get("timeout_s"), options.get("priority", 0), options.get("disconnected")


def refuse_sequence(model: str, options: InferOptions) -> None:
    """A sequence_id sent to a graph without sequence batching: refused, not ignored."""
    if options.get("sequence") is not None:
        raise InvalidInput(
            SEQUENCE_ID,
            f"model '{model}' is not a stateful model (it has no sequence_batching): send "
            "no sequence_id",
        )


def check_one_row(model: str, rows: TensorRows, batchable: bool) -> None:
    """Triton's sequence batcher takes one row a request (each row is a sequence's step)."""
    if batchable and rows.rows != 1:
        raise InvalidInput(
            "inputs",
            f"inference request to model '{model}' must specify batch-size 1 due to "
            f"requirements of sequence batcher (got {rows.rows} rows)",
        )


def check_sequence_names(
    model: str, config: SequenceBatching, graph: Signature, batch_axis: int
) -> None:
    """At start: the controls and state name the graph's own inputs and outputs."""
    for name in (*config.controls, *(s.input for s in config.state)):
        if name not in graph.input_names:
            raise ValueError(
                f"model {model!r}: sequence_batching names input {name!r}, which is not among "
                f"its inputs {list(graph.input_names)}"
            )
    for state in config.state:
        if state.output not in graph.output_names:
            raise ValueError(
                f"model {model!r}: sequence_batching.state names output {state.output!r}, "
                f"which is not among its outputs {list(graph.output_names)}"
            )
    if batch_axis != 0:
        raise ValueError(f"model {model!r}: sequence_batching needs its rows on axis 0")
    left = set(graph.input_names) - set(config.controls) - {s.input for s in config.state}
    if not left:
        raise ValueError(f"model {model!r}: sequence_batching fills every input of the graph")


def graph_rows(
    signature: Signature,
    batchable: bool,
    padded: frozenset[str],
    tensors: Mapping[str, np.ndarray],
) -> TensorRows:
    """The request's rows; only requests of equal sizes along the unpadded axes batch."""
    rows = valid_rows(signature, tensors, batchable)
    sizes = rows.axis_sizes
    if set(sizes) <= padded:
        return rows
    kept = {axis: size for axis, size in sizes.items() if axis in padded}
    key = tuple(sorted((axis, size) for axis, size in sizes.items() if axis not in kept))
    return replace(rows, axis_sizes=kept, shape_key=key)


def plan_rows(
    signature: Signature, plan: BatchPlan, tensors: Mapping[str, np.ndarray]
) -> TensorRows:
    """`graph_rows` by the model's batch plan: with a batch axis other than 0, each input's
    rows moved first (the batcher stacks and pads along axis 0; `graph_values` moves back)."""
    if plan.rows_signature is not None:
        order = plan.rows_axes
        tensors = {
            name: np.ascontiguousarray(np.moveaxis(array, order[name], 0))
            if name in order and array.ndim > order[name]
            else array
            for name, array in tensors.items()
        }
        signature = plan.rows_signature
    return graph_rows(signature, plan.batched, plan.padded, tensors)


def graph_values(
    plan: BatchPlan, values: Mapping[str, np.ndarray], *, into_batch: bool
) -> dict[str, np.ndarray]:
    """Tensors between the graph's layout and the batcher's (rows first): `into_batch` moves
    each tensor's axis of rows to 0, else back to where the graph has it."""
    order = plan.rows_axes
    if not order:
        return dict(values)
    return {
        name: np.ascontiguousarray(
            np.moveaxis(value, order[name], 0) if into_batch else np.moveaxis(value, 0, order[name])
        )
        if name in order
        else value
        for name, value in values.items()
    }


def rows_first(model: GraphModel) -> bool:
    """Whether its rows are on axis 0 as Triton has them (max_batch_size > 0, dims without the
    batch axis; classification per row)."""
    return model.batchable and model.batch_plan.batch_axis == 0


def graph_outputs(
    signature: Signature,
    default: tuple[str, ...],
    requested: Sequence[str | None] | None,
    tensors: bool,
) -> tuple[str, ...]:
    """The outputs a request names (checked), else `default` (the configured ones), or with
    `tensors` (KServe) every one, as encoders."""
    choices = signature.output_names
    for name in requested or ():
        if name not in choices:
            raise InvalidInput("outputs", f"unknown output {name!r}; choose from {list(choices)}")
    if requested:
        return tuple(requested)  # type: ignore[arg-type]  # each name checked above: no None
    return choices if tensors else default


async def prepare(model: GraphModel, tensors: Mapping[str, np.ndarray]) -> TensorRows:
    """`model.validate(tensors)`, after decoding the encoded images a request sent (in the
    model's worker pool, off the event loop)."""
    if model.images is not None:
        try:
            tensors = await model.images.decoded(tensors)
        except InvalidInput:
            model.count_invalid()
            raise
    return model.validate(tensors)


def class_count(model: GraphModel, name: str) -> int | None:
    """Classes (values) in a row of output `name`; of the whole output for a fixed first axis,
    except ZipMap's (by row always). None: not known before a run."""
    spec = model.signature.output(name)
    if spec.class_map:
        keys = model.class_keys.get(name)
        return len(keys) if keys else None
    dims = spec.shape[1:] if rows_first(model) else spec.shape
    sizes = [d for d in dims if isinstance(d, int)]
    return math.prod(sizes) if len(sizes) == len(dims) else None


def class_labels(model: GraphModel, name: str) -> tuple[str, ...] | None:
    """Output `name`'s class labels: the configured ones, else a ZipMap's keys."""
    if name in model.settings.labels:
        return model.settings.labels[name]
    keys = model.class_keys.get(name)
    return tuple(str(k) for k in keys) if keys else None
