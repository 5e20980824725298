"""GPU only: build a TensorRT plan; run it in Triton and query it through Ferry.

The plan test needs the `tensorrt` Python package (`pip install '.[tensorrt]'`, pinned to the
TensorRT 10.3 of the Triton 24.08 image in deploy/docker-compose.yml: a plan loads only on the
TensorRT that built it) or `trtexec`. The Triton test also needs a full Triton server with the
tensorrt backend (`tritonserver` on PATH, or FERRY_TRITONSERVER=/path/to/it): the pip-installed
CPU server has only the python backend, so without one that test skips and says so.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from ferry.backends.manifest import ModelManifest
from ferry.bench.processes import ManagedProcess, free_port, http_ok, running
from ferry.bench.server_process import default_model_config, ferry_server
from ferry.exporters.tensorrt import build_plan, derive_profile, gpu_present
from ferry.exporters.triton_repo import Batching, write_repository

pytestmark = [
    pytest.mark.system,
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU on this host"),
]
# Triton 24.08 (deploy/docker-compose.yml) runs TensorRT 10.3.
TRITON_TENSORRT = "10.3."
READY_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def plan(default_model_dir, tmp_path_factory) -> Path:
    if importlib.util.find_spec("tensorrt") is None and shutil.which("trtexec") is None:
        pytest.skip(
            "neither the tensorrt package nor trtexec: pip install '.[tensorrt]' (TensorRT 10.3, "
            "whose libraries come from NVIDIA's package index)"
        )
    profile = derive_profile(8, ModelManifest.read(default_model_dir).max_length)
    out = tmp_path_factory.mktemp("trt") / "model.plan"
    return build_plan(default_model_dir / "model.onnx", out, profile)


def test_plan_is_built_by_the_tensorrt_triton_runs_and_loads(plan):
    trt = pytest.importorskip("tensorrt", reason="plan built by trtexec; no tensorrt to load it")
    assert trt.__version__.startswith(TRITON_TENSORRT), (
        f"tensorrt {trt.__version__}: Triton 24.08 loads only plans of TensorRT {TRITON_TENSORRT}x"
    )
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan.read_bytes())
    assert engine is not None
    names = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
    assert {"input_ids", "attention_mask", "sentence_embedding"} <= names
    assert tuple(engine.get_tensor_profile_shape("input_ids", 0)[2]) == (8, 256)


@pytest.fixture(scope="module")
def tensorrt_triton(default_model_dir, plan, tmp_path_factory):
    binary = os.environ.get("FERRY_TRITONSERVER") or shutil.which("tritonserver")
    if binary is None:
        pytest.skip(
            "no full Triton server with the tensorrt backend: put `tritonserver` (Triton 24.08) "
            "on PATH or set FERRY_TRITONSERVER=/path/to/tritonserver"
        )
    work = tmp_path_factory.mktemp("trt-repo")
    repository = work / "repo"
    write_repository(default_model_dir, repository, "tensorrt", Batching(8), name="m", plan=plan)
    http, grpc, metrics = free_port(), free_port(), free_port()
    command = [
        binary,
        f"--model-repository={repository}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
    ]
    ready = http_ok(f"http://127.0.0.1:{http}/v2/health/ready")
    triton = ManagedProcess("tritonserver", command, work / "triton.log", ready, grace_s=30)
    with running(triton, READY_TIMEOUT_S):
        yield f"127.0.0.1:{grpc}"


def test_tensorrt_plan_served_through_ferry_matches_onnxruntime(tensorrt_triton, embed_alone):
    model = default_model_config(
        name="m",
        backend={"kind": "triton", "url": tensorrt_triton, "protocol": "grpc", "model": "m"},
        batching={"max_batch_size": 8},
    )
    ids = [101, 7592, 2088, 2003, 1037, 3899, 102]
    with ferry_server([model]) as server:
        response = httpx.post(f"{server.url}/predict", json={"input_ids": ids}, timeout=60)
    assert response.status_code == 200, response.text
    got = np.asarray(response.json()["outputs"][0]["sentence_embedding"])
    want = embed_alone(ids)
    # fp16 engine: compare direction, not digits.
    assert float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))) >= 0.999
