"""GPU only: ONNX Runtime really runs on the CUDA EP, and its outputs are the CPU's.

Needs onnxruntime-gpu with its CUDA 13 / cuDNN 9 libraries (`pip install '.[gpu]'` brings them as
wheels): a host where the CUDA EP cannot load fails here, which is the point.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from ferry.backends.onnxruntime import OnnxRuntimeBackend
from ferry.backends.placement import CUDA_EP
from ferry.batcher import TokenSequence, pad_batch
from ferry.bench.server_process import default_model_config, ferry_server
from ferry.exporters.quantize import convert_fp16
from tests.gpu import requires_gpu
from tests.support.metrics import metric_value

pytestmark = [pytest.mark.integration, pytest.mark.gpu, requires_gpu]

IDS = [[101, 7592, 2088, 2003, 1037, 3899, 102], [101, 2023, 102], [101, *range(2000, 2100), 102]]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


async def run_on(model_path, device: str) -> tuple[list[str], dict[str, np.ndarray]]:
    backend = OnnxRuntimeBackend(model_path, sessions=1, device=device)
    await backend.start()
    try:
        outputs = await backend.infer(pad_batch([TokenSequence.from_ids(i) for i in IDS]))
        return backend.providers, outputs
    finally:
        await backend.close()


async def test_first_provider_is_cuda_and_outputs_are_the_cpus(default_model_dir):
    providers, gpu = await run_on(default_model_dir / "model.onnx", "cuda")
    assert providers[0] == CUDA_EP
    _, cpu = await run_on(default_model_dir / "model.onnx", "cpu")
    # fp32 on the GPU (TF32 matmuls allowed by default): close to the CPU, not bit-equal.
    assert np.max(np.abs(gpu["sentence_embedding"] - cpu["sentence_embedding"])) <= 2e-3
    assert np.min(cosines(gpu["sentence_embedding"], cpu["sentence_embedding"])) >= 0.9999


async def test_fp16_export_on_cuda_keeps_embeddings(default_model_dir, tmp_path):
    fp16 = convert_fp16(default_model_dir, tmp_path / "fp16")
    providers, gpu = await run_on(fp16, "cuda")
    assert providers[0] == CUDA_EP
    _, cpu = await run_on(default_model_dir / "model.onnx", "cpu")
    assert np.min(cosines(gpu["sentence_embedding"], cpu["sentence_embedding"])) >= 0.999


def test_ferry_serves_on_the_gpu_and_exports_its_memory(embed_alone):
    ids = [101, 7592, 2088, 2003, 1037, 3899, 102]
    with ferry_server(
        [default_model_config(backend={"device": "cuda"})], ready_timeout_s=180
    ) as server:
        response = httpx.post(f"{server.url}/predict", json={"input_ids": ids}, timeout=60)
        metrics = server.metrics()
    assert response.status_code == 200, response.text
    got = np.asarray(response.json()["outputs"][0]["sentence_embedding"])
    assert float(cosines(got[None], embed_alone(ids)[None])[0]) >= 0.9999
    assert metric_value(metrics, "ferry_gpu_memory_used_bytes", gpu="0") > 0
    assert metric_value(metrics, "ferry_gpu_memory_total_bytes", gpu="0") > 0
