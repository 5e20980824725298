"""GPU only: build a TensorRT plan, serve it from a `tensorrt_plan` repository, query via Ferry.

Needs, on the GPU host, the `tensorrt` Python package or `trtexec`, and a full Triton server
(with the tensorrt backend: `tritonserver` on PATH, or FERRY_TRITONSERVER=/path/to/it); the
pip-installed CPU server has only the python backend.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from ferry.exporters.manifest import ModelManifest
from ferry.exporters.tensorrt import build_plan, derive_profile, gpu_present
from ferry.exporters.triton_repo import Batching, write_repository

from tests.server_process import default_model_config, ferry_server, free_port

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU on this host"),
]


@pytest.fixture(scope="module")
def tensorrt_triton(default_model_dir, tmp_path_factory):
    binary = os.environ.get("FERRY_TRITONSERVER") or shutil.which("tritonserver")
    if binary is None:
        pytest.fail("a GPU is present but no full tritonserver: set FERRY_TRITONSERVER")
    work = tmp_path_factory.mktemp("trt")
    profile = derive_profile(8, ModelManifest.read(default_model_dir).max_length)
    plan = build_plan(default_model_dir / "model.onnx", work / "model.plan", profile)
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
    with open(work / "triton.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{http}/v2/health/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, Path(work / "triton.log").read_text()
            time.sleep(0.5)
        yield f"127.0.0.1:{grpc}"
    finally:
        process.terminate()
        process.wait(30)


def test_tensorrt_plan_served_through_ferry_matches_onnxruntime(tensorrt_triton, embed_alone):
    model = default_model_config(
        name="m",
        backend="triton",
        triton_url=tensorrt_triton,
        triton_protocol="grpc",
        triton_model="m",
        max_batch_size=8,
    )
    ids = [101, 7592, 2088, 2003, 1037, 3899, 102]
    with ferry_server([model]) as server:
        response = httpx.post(f"{server.url}/predict", json={"input_ids": ids}, timeout=60)
    assert response.status_code == 200, response.text
    got = np.asarray(response.json()["outputs"][0]["sentence_embedding"])
    want = embed_alone(ids)
    # fp16 engine: compare direction, not digits.
    assert float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))) >= 0.999
