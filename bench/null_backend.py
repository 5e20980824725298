"""`ferry serve` with every model on a backend that answers at once: the HTTP front end's ceiling.

Everything but the model runs as in production (routes, tokenizer, batcher, metrics, JSON); the
backend returns zero embeddings of the model's width without computing anything. A plain ONNX
graph (KServe v2 tensors) keeps its own signature, read from its session at start, and answers
every batch with zeros of its outputs' shapes (`ZeroTensorBackend`). A benchmark
compares Ferry's real throughput with this figure to see how much the front end caps it.

python -m ferry.bench.null_backend serve --config ferry.toml [--port 8000]
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from ferry.backends.onnx_tensors import OnnxTensorBackend
from ferry.backends.options import OnnxRuntimeOptions
from ferry.batcher.padding import PaddedBatch
from ferry.server.settings import ModelSettings

OUTPUT = "sentence_embedding"
WIDTH = 384  # all-MiniLM-L6-v2's; the response carries as many floats as the real model's


class NullBackend:
    name = "null"
    output_names = (OUTPUT,)
    sequence_outputs: frozenset[str] = frozenset()
    max_concurrency = 4
    queues_batches = False  # batches wait for a free slot in the loop, as before
    takes_token_types = False

    async def start(self) -> None:
        return None

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        return {OUTPUT: np.zeros((batch.size, WIDTH), dtype=np.float32)}

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class ZeroTensorBackend(OnnxTensorBackend):
    """A plain graph's backend whose runs compute nothing: zeros of each output's shape, the
    batch's rows first (any other dynamic axis 1), after `wait` (a simulated device's time;
    none here). The session is still made at start: the signature comes from the graph."""

    def __init__(
        self,
        model_path: Path,
        options: OnnxRuntimeOptions,
        wait: Callable[[dict[str, np.ndarray]], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(model_path, options)
        self._wait = wait

    async def run(self, feeds: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, Any]:
        if self._wait is not None:
            await self._wait(feeds)
        rows = next(iter(feeds.values())).shape[0]
        outputs = {spec.name: spec for spec in self.signature.outputs}
        return {
            name: np.zeros(
                (rows, *(d if isinstance(d, int) else 1 for d in outputs[name].shape[1:])),
                outputs[name].dtype,
            )
            for name in names
        }


def build_null_backend(settings: ModelSettings) -> NullBackend:
    return NullBackend()


def install() -> None:
    """Every model this process builds answers at once. The two seams: ModelRuntime (text
    encoders) and GraphRuntime (plain graphs) build their backends through module-level names."""
    from ferry.server import graph_runtime, model_runtime

    model_runtime.build_backend = build_null_backend
    graph_runtime.OnnxTensorBackend = ZeroTensorBackend  # type: ignore[misc]  # the seam


def main(argv: list[str] | None = None) -> int:
    from ferry import cli

    install()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__mp_main__":
    # A process spawned by this entry point (api_servers > 1: the engine process) imports it under
    # this name: its models get the null backend too.
    install()
