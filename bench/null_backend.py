"""`ferry serve` with every model on a backend that answers at once: the HTTP front end's ceiling.

Everything but the model runs as in production (routes, tokenizer, batcher, metrics, JSON); the
backend returns zero embeddings of the model's width without computing anything. A benchmark
compares Ferry's real throughput with this figure to see how much the front end caps it.

python -m ferry.bench.null_backend serve --config ferry.toml [--port 8000]
"""

from __future__ import annotations

import sys

import numpy as np

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


def build_null_backend(settings: ModelSettings) -> NullBackend:
    return NullBackend()


def main(argv: list[str] | None = None) -> int:
    from ferry import cli
    from ferry.server import model_runtime

    # The one seam: ModelRuntime builds its backend through this module-level function.
    model_runtime.build_backend = build_null_backend
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__mp_main__":
    # A process spawned by this entry point (api_servers > 1: the engine process) imports it under
    # this name: its models get the null backend too.
    from ferry.server import model_runtime

    model_runtime.build_backend = build_null_backend
