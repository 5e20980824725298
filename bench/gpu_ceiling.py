"""The in-process batched ceiling of a backend: sorted batches straight into it, no HTTP, no queue.

The same backend class Ferry serves with (so the same sessions, streams and precision), fed
batches of inputs sorted by length (the least padding any batcher could reach), as many in
flight as the backend runs at once. What Ferry reaches over HTTP is compared with this.
"""

from __future__ import annotations

import asyncio
import time

from ferry.backends.base import Backend
from ferry.batcher import TokenSequence, pad_batch
from ferry.bench.gpu_model import BenchModel

WARMUP_BATCHES = 8


def build(kind: str, model: BenchModel, device: str) -> Backend:
    if kind == "torch":
        from ferry.backends.torch_backend import TorchBackend

        return TorchBackend(model.hf_dir, device=device)  # type: ignore[arg-type]
    from ferry.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend(model.onnx_dir / "model.onnx", sessions=2, device=device)  # type: ignore[arg-type]


async def backend_ceilings(
    kind: str, model: BenchModel, device: str, sets: dict[str, list[list[int]]], batch_size: int
) -> dict[str, float]:
    """Sequences per second of `kind` ("onnxruntime" or "torch") on each input set."""
    backend = build(kind, model, device)
    await backend.start()
    try:
        return {
            name: await sorted_batches_throughput(backend, inputs, batch_size)
            for name, inputs in sets.items()
        }
    finally:
        await backend.close()


async def sorted_batches_throughput(
    backend: Backend, inputs: list[list[int]], batch_size: int
) -> float:
    """Sequences per second: `inputs` sorted by length, cut into batches of `batch_size`, as many
    in flight as the backend runs at once, back to back."""
    ordered = sorted(inputs, key=len)
    batches = [
        pad_batch([TokenSequence.from_ids(ids) for ids in ordered[i : i + batch_size]])
        for i in range(0, len(ordered), batch_size)
    ]
    slots = asyncio.Semaphore(backend.max_concurrency)

    async def run(batch) -> None:
        async with slots:
            await backend.infer(batch)

    await asyncio.gather(*(run(b) for b in batches[:WARMUP_BATCHES]))
    started = time.perf_counter()
    await asyncio.gather(*(run(b) for b in batches))
    return len(ordered) / (time.perf_counter() - started)
