"""Fixtures for tests against a real Triton server (CPU, python backend running ONNX Runtime)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.bench.processes import TritonProcess, triton_server
from ferry.bench.triton_env import TritonLayout, ensure
from ferry.exporters.triton_repo import Batching, write_repository

TRITON_MODEL = "minilm"


@pytest.fixture(scope="session")
def triton_layout() -> TritonLayout:
    # `make test` builds it first (bench/triton_env.py); this only checks, or builds if missing.
    return ensure()


@pytest.fixture(scope="session")
def triton_repository(tmp_path_factory, default_model_dir: Path) -> Path:
    repository = tmp_path_factory.mktemp("triton-repo")
    write_repository(
        default_model_dir, repository, "python", Batching(max_batch_size=32), name=TRITON_MODEL
    )
    return repository


@pytest.fixture(scope="module")
def triton(triton_layout, triton_repository, tmp_path_factory) -> Iterator[TritonProcess]:
    with triton_server(triton_repository, tmp_path_factory.mktemp("log"), triton_layout) as s:
        yield s
