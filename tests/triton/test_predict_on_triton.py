"""Ferry's /predict on the Triton backend: a real `ferry serve`, a real Triton, real sockets."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import numpy as np
import pytest

from ferry.bench.processes import triton_server
from ferry.bench.server_process import DEFAULT_MODEL, default_model_config, ferry_server
from tests.triton.conftest import TRITON_MODEL

pytestmark = pytest.mark.system

RNG = np.random.default_rng(11)


def random_ids(length: int) -> list[int]:
    return [101, *RNG.integers(2000, 29000, size=length - 2).tolist(), 102]


def triton_model(
    name: str, triton, protocol: str, mode: str = "batch", concurrency: int = 2, **batching
) -> dict:
    backend = {"kind": "triton", "url": triton.url_for(protocol), "protocol": protocol}
    return default_model_config(
        name=name,
        backend={**backend, "model": TRITON_MODEL, "mode": mode, "concurrency": concurrency},
        batching=batching,
        timeout_s=20,
    )


@pytest.fixture(scope="module")
def ferry(triton):
    models = [
        default_model_config(name="ort"),
        triton_model("triton-http", triton, "http"),
        triton_model("triton-grpc", triton, "grpc", concurrency=3),
        triton_model("triton-pass", triton, "grpc", mode="passthrough"),
    ]
    with ferry_server(models) as handle:
        yield handle


async def predict_all(url: str, model: str, inputs: list[list[int]]) -> list[np.ndarray]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        responses = await asyncio.gather(
            *(client.post("/predict", json={"model": model, "input_ids": ids}) for ids in inputs)
        )
    assert [r.status_code for r in responses] == [200] * len(inputs), responses[0].text
    return [np.asarray(r.json()["outputs"][0]["sentence_embedding"]) for r in responses]


@pytest.mark.parametrize("model", ["triton-http", "triton-grpc", "triton-pass"])
def test_triton_embeddings_equal_onnxruntime_backend(ferry, model):
    inputs = [random_ids(int(n)) for n in RNG.integers(6, 100, size=24)]
    on_ort = asyncio.run(predict_all(ferry.url, "ort", inputs))
    on_triton = asyncio.run(predict_all(ferry.url, model, inputs))
    for want, got in zip(on_ort, on_triton, strict=True):
        assert np.max(np.abs(want - got)) <= 1e-5


def test_the_triton_backend_runs_as_many_batches_at_once_as_its_concurrency(ferry):
    # Triton's model config JSON (KServe v2) reports the instances Ferry runs batches on.
    configs = {
        name: httpx.get(f"{ferry.url}/v2/models/{name}/config", timeout=10).json()
        for name in ("triton-http", "triton-grpc")
    }
    counts = {name: config["instance_group"][0]["count"] for name, config in configs.items()}
    assert counts == {"triton-http": 2, "triton-grpc": 3}


def triton_counter(text: str, name: str) -> float:
    # Read by hand: prometheus_client's parser renames counters lacking `_total`.
    pattern = rf'^{name}{{[^}}]*model="{TRITON_MODEL}"[^}}]*}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, flags=re.MULTILINE))


def test_passthrough_leaves_batching_to_triton(ferry, triton):
    def counts() -> tuple[float, float]:
        text = triton.metrics()
        return (
            triton_counter(text, "nv_inference_count"),
            triton_counter(text, "nv_inference_exec_count"),
        )

    inferences_before, executions_before = counts()
    inputs = [random_ids(int(n)) for n in RNG.integers(6, 100, size=64)]
    asyncio.run(predict_all(ferry.url, "triton-pass", inputs))
    inferences_after, executions_after = counts()
    inferences = inferences_after - inferences_before
    executions = executions_after - executions_before
    # Every row reached Triton as its own request, and Triton ran several in one execution.
    assert inferences == 64
    assert executions < inferences


def test_triton_down_answers_503_and_recovers(triton_layout, triton_repository, tmp_path):
    with triton_server(triton_repository, tmp_path, triton_layout) as own_triton:
        models = [
            triton_model(TRITON_MODEL, own_triton, "grpc", max_queue_delay_s=0.001),
            default_model_config(),
        ]
        with ferry_server(models) as ferry:
            body = {"input_ids": random_ids(12)}
            assert httpx.post(f"{ferry.url}/predict", json=body, timeout=30).status_code == 200

            own_triton.stop()
            down = httpx.post(f"{ferry.url}/predict", json=body, timeout=30)
            assert down.status_code == 503
            assert "Triton model 'minilm'" in down.json()["error"]["message"]
            assert "unavailable" in down.json()["error"]["message"]
            assert httpx.get(f"{ferry.url}/health/ready", timeout=10).status_code == 503
            # Only the affected model fails: the ONNX Runtime model keeps serving.
            other = {**body, "model": DEFAULT_MODEL}
            assert httpx.post(f"{ferry.url}/predict", json=other, timeout=30).status_code == 200

            own_triton.start()
            deadline = time.monotonic() + 30
            status = None
            while time.monotonic() < deadline and status != 200:
                status = httpx.post(f"{ferry.url}/predict", json=body, timeout=30).status_code
                time.sleep(0.2)
            assert status == 200
            assert httpx.get(f"{ferry.url}/health/ready", timeout=10).status_code == 200
