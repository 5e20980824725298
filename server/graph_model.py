"""What the server uses of a plain ONNX graph: the routes, KServe and the registry see only this.
`TensorModel` (tensor_model.py) runs the graph in this process; in an API process
`RemoteTensorModel` (procs/remote.py) forwards validated rows to the engine process's.

The request rules both apply alike (which rows a request holds, which outputs it gets) are here,
so an API process decides a request's 4xx exactly as the engine process would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ferry.backends.tensor_signature import Signature
from ferry.batcher import TensorRows
from ferry.server.errors import InvalidInput
from ferry.server.settings import ModelSettings
from ferry.server.tensor_inputs import valid_rows


class GraphBackend(Protocol):
    """What KServe's model config reads of the backend."""

    @property
    def name(self) -> str: ...
    @property
    def max_concurrency(self) -> int: ...


@runtime_checkable
class GraphModel(Protocol):
    """Told from an `EncoderModel` by `isinstance` (the routes branch on it)."""

    task: str  # "tensor", as /v1/models lists it

    @property
    def name(self) -> str: ...
    @property
    def settings(self) -> ModelSettings: ...
    @property
    def backend(self) -> GraphBackend: ...
    @property
    def signature(self) -> Signature: ...
    @property
    def class_keys(self) -> Mapping[str, list[Any]]:
        """A ZipMap output's classes, in the order of its [N, C] tensor's columns."""

    @property
    def batchable(self) -> bool: ...
    @property
    def ready(self) -> bool: ...

    async def start(self) -> None: ...

    async def healthy(self) -> bool: ...

    def validate(self, tensors: Mapping[str, np.ndarray]) -> TensorRows:
        """A request's tensors checked against the signature (InvalidInput naming the input)."""

    def select_outputs(
        self, requested: Sequence[str | None] | None, *, tensors: bool = False
    ) -> tuple[str, ...]: ...

    async def infer(
        self,
        rows: TensorRows,
        outputs: Sequence[str],
        timeout_s: float | None = None,
        priority: int = 0,
        disconnected: asyncio.Future[None] | None = None,
    ) -> dict[str, np.ndarray]:
        """A validated request's outputs, its rows on the first axis (nothing checked again)."""

    def count_invalid(self) -> None: ...

    async def close(self, drain_timeout_s: float) -> None: ...


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
