from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ferry.bench.server_process import DEFAULT_LLM_DIR, DEFAULT_MODEL_DIR

# Each test module declares its tier (unit, integration, system); the plugin checks it and fails a
# unit test that starts a process. pytester runs the plugin's own tests. worker_groups: which
# tests share a worker under `pytest -n`.
pytest_plugins = ("tests.support.tiers", "tests.support.worker_groups", "pytester")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    if not (DEFAULT_MODEL_DIR / "model.onnx").exists():
        pytest.fail("default model missing: run `make model` (make test does it)")
    return DEFAULT_MODEL_DIR


@pytest.fixture(scope="session")
def default_llm_dir() -> Path:
    """The real default chat model (SmolLM2-135M-Instruct, onnxruntime-genai int4)."""
    if not (DEFAULT_LLM_DIR / "genai_config.json").exists():
        pytest.fail("default chat model missing: run `make model` (make test does it)")
    return DEFAULT_LLM_DIR


@pytest.fixture(scope="session")
def triton_models(tmp_path_factory):
    """Ferry serving the models of Triton's example clients and qa tests over HTTP and gRPC
    (`.http_address`, `.grpc_address`: host:port, what the clients take as `-u`); one for the
    session (fourteen models take a while to start), which no test may change."""
    from tests.support.triton_example_models import triton_server  # onnx, only when used

    with triton_server(tmp_path_factory.mktemp("triton_models")) as handle:
        yield handle


@pytest.fixture(scope="session")
def reference_session(default_model_dir: Path):
    """Plain in-process ONNX Runtime: the ground truth every served result is compared with."""
    import onnxruntime as ort

    return ort.InferenceSession(
        str(default_model_dir / "model.onnx"), providers=["CPUExecutionProvider"]
    )


@pytest.fixture(scope="session")
def embed_alone(reference_session):
    def run(ids: list[int]) -> np.ndarray:
        feeds = {
            "input_ids": np.asarray([ids], dtype=np.int64),
            "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
        }
        return reference_session.run(["sentence_embedding"], feeds)[0][0]

    return run
