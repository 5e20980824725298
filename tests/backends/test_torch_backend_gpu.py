"""GPU only: the torch backend in float16 / bfloat16 on CUDA, eager and compiled, vs the CPU's ONNX.

Needs PyTorch with CUDA (`pip install '.[torch]'` on a GPU host, or the host's own). The model is
all-MiniLM-L6-v2 when its package and export are present, else a random BERT of its shape with its
ONNX export (`ferry.bench.gpu_model`): a GPU host needs nothing downloaded.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ferry.backends.onnxruntime import OnnxRuntimeBackend
from ferry.backends.torch_backend import TorchBackend
from ferry.batcher import TokenSequence, pad_batch
from ferry.bench.gpu_model import BenchModel, bench_model
from ferry.bench.server_process import DEFAULT_MODEL_DIR
from tests.gpu import requires_gpu

# integration: torch.compile's inductor compiles in worker processes.
pytestmark = [pytest.mark.integration, pytest.mark.gpu, requires_gpu]

IDS = [[101, 7592, 2088, 2003, 1037, 3899, 102], [101, 2023, 102], [101, *range(2000, 2100), 102]]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> BenchModel:
    return bench_model(tmp_path_factory.mktemp("gpu-model"), DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def reference(model: BenchModel) -> np.ndarray:
    async def run() -> np.ndarray:
        backend = OnnxRuntimeBackend(model.onnx_dir / "model.onnx", sessions=1, device="cpu")
        await backend.start()
        try:
            batch = pad_batch([TokenSequence.from_ids(i) for i in IDS])
            return (await backend.infer(batch))["sentence_embedding"]
        finally:
            await backend.close()

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("dtype", "compile", "cuda_graphs"),
    [
        ("float16", False, False),
        ("bfloat16", False, False),
        ("float16", True, False),
        ("float16", False, True),  # replayed CUDA graphs, 4 x 128 bucket (torch_graphs.py)
    ],
)
async def test_half_precision_on_cuda_matches_the_cpu(
    model, reference, dtype, compile, cuda_graphs
):
    backend = TorchBackend(
        model.hf_dir, device="cuda", dtype=dtype, compile=compile, cuda_graphs=cuda_graphs
    )
    await backend.start()
    try:
        assert (backend.device, backend.dtype_name) == ("cuda", dtype)
        batch = pad_batch([TokenSequence.from_ids(i) for i in IDS])
        # Two batches at once: each on its own CUDA stream, neither may see the other's data.
        first, second = await asyncio.gather(backend.infer(batch), backend.infer(batch))
        for outputs in (first, second):
            got = outputs["sentence_embedding"]
            assert got.dtype == np.float32
            # bfloat16 keeps 8 bits of mantissa: close in direction, not in digits.
            assert np.min(cosines(got, reference)) >= (0.999 if dtype == "float16" else 0.995)
        if cuda_graphs:  # replayed, not run eagerly after a failed capture
            assert any((4, 128) in graphs._graphs for graphs in backend._graphs.values())
    finally:
        await backend.close()
