"""CUDA graphs for the torch backend: a batch's kernel launches replayed as one (issue 43).

Eager PyTorch launches every kernel of an encoder from Python, holding the GIL for each: for
MiniLM on an H100 a batch of 1 x 16 tokens took 2.8-4.3 ms, most of it launches, while the event
loop that feeds the device waited for the same GIL. A CUDA graph captured once for a shape
replays all of its kernels from the driver in one call.

A graph has fixed shapes, so batches go in buckets: rows up to a power of two, the length up to
one of LENGTHS. A batch is padded to its bucket as the batcher pads it to its longest row: the
extra positions and rows are masked (a padding row holds one token, so no softmax runs over
nothing), and the outputs are cut back to the batch's rows and length. Batches past the largest
bucket run eagerly. Each stream has its own graphs and memory pool: two batches replay at once.
Graphs are captured on first use of a bucket, after a warm-up run on a side stream (cuBLAS
and cuDNN pick their kernels outside the capture).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

LENGTHS = (16, 32, 64, 128, 256, 512)
# torch tensors: input_ids, attention_mask, token_type_ids -> every output, full bucket shape.
Forward = Callable[[Any, Any, Any], dict[str, Any]]


def bucket(rows: int, length: int, max_rows: int, max_length: int) -> tuple[int, int] | None:
    """The (rows, length) a batch runs as, or None: past the largest bucket, run eagerly."""
    padded_rows = 1 << max(0, rows - 1).bit_length()
    padded_length = next((n for n in LENGTHS if n >= length), None)
    if padded_rows > max_rows or padded_length is None or padded_length > max_length:
        return None
    return padded_rows, padded_length


def pad_into(
    ids: np.ndarray, mask: np.ndarray, types: np.ndarray, out: tuple[np.ndarray, ...]
) -> None:
    """The batch written into a bucket's buffers: masked positions and rows, each padding row
    one token."""
    rows, length = ids.shape
    for target, source in zip(out, (ids, mask, types), strict=True):
        target.fill(0)
        target[:rows, :length] = source
    out[1][rows:, 0] = 1


class CudaGraphs:
    """One stream's graphs, by bucket. `capture=False` runs the same padded path eagerly (the
    CPU, where no graph exists: the bucketing is tested there)."""

    def __init__(
        self,
        forward: Forward,
        device: str,
        stream: Any,
        max_rows: int,
        max_length: int,
        capture: bool = True,
    ) -> None:
        self._forward = forward
        self._device = device
        self._stream = stream
        self._max_rows = max_rows
        self._max_length = max_length
        self._capture = capture
        self._pool: Any = None
        # bucket -> (static inputs, static outputs, graph)
        self._graphs: dict[tuple[int, int], tuple[tuple[Any, Any, Any], dict[str, Any], Any]] = {}
        self._uncapturable: set[tuple[int, int]] = set()  # their capture failed: run eagerly
        # Host buffers by bucket, reused batch after batch; pinned on CUDA, so the copy to the
        # device is asynchronous on the stream.
        self._host: dict[tuple[int, int], tuple[Any, ...]] = {}

    def run(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> dict[str, Any] | None:
        """Every output cut to the batch's rows and length, or None: no bucket holds it."""
        rows, length = ids.shape
        shape = bucket(rows, length, self._max_rows, self._max_length)
        if shape is None or shape in self._uncapturable:
            return None

        padded = self._host_buffers(shape)
        pad_into(ids, mask, types, tuple(t.numpy() for t in padded))
        if not self._capture:
            outputs = self._forward(*(t.to(self._device) for t in padded))
        else:
            captured = self._graphs.get(shape) or self._captured(shape)
            if captured is None:
                return None
            inputs, outputs, graph = captured
            for static, tensor in zip(inputs, padded, strict=True):
                static.copy_(tensor, non_blocking=True)
            graph.replay()
        return {name: _cut(value, rows, length) for name, value in outputs.items()}

    def _host_buffers(self, shape: tuple[int, int]) -> tuple[Any, ...]:
        import torch

        if shape not in self._host:
            pinned = self._capture  # pinning needs CUDA
            self._host[shape] = tuple(
                torch.zeros(shape, dtype=torch.int64, pin_memory=pinned) for _ in range(3)
            )
        return self._host[shape]

    def _captured(
        self, shape: tuple[int, int]
    ) -> tuple[tuple[Any, Any, Any], dict[str, Any], Any] | None:
        """The bucket's graph, captured now; None when the model cannot be captured (a host
        sync inside its forward, as a data-dependent mask check): that bucket then runs eagerly,
        and the log says so once."""
        try:
            return self._capture_now(shape)
        except RuntimeError as exc:
            self._uncapturable.add(shape)
            logger.warning("torch: no CUDA graph for %d x %d tokens (%s): eager", *shape, exc)
            return None

    def _capture_now(
        self, shape: tuple[int, int]
    ) -> tuple[tuple[Any, Any, Any], dict[str, Any], Any]:
        import torch

        zeros = (torch.zeros(shape, dtype=torch.int64, device=self._device) for _ in range(3))
        ids, mask, types = zeros
        mask[:, 0] = 1
        inputs = (ids, mask, types)
        warmup = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # unannotated in torch
        warmup.wait_stream(self._stream)
        with torch.cuda.stream(warmup):
            self._forward(*inputs)
        self._stream.wait_stream(warmup)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # thread_local: the other stream's thread may launch and synchronise meanwhile.
        with torch.cuda.graph(
            graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"
        ):
            outputs = self._forward(*inputs)
        self._graphs[shape] = (inputs, outputs, graph)
        logger.info("torch: CUDA graph captured for %d x %d tokens", *shape)
        return self._graphs[shape]


def _cut(value: Any, rows: int, length: int) -> Any:
    """An output of the bucket's shape cut to the batch's: rows first, then the length where the
    output has one (hidden states), never a pooled output's width."""
    value = value[:rows]
    return value[:, :length] if value.dim() == 3 else value
