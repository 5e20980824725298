from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from ferry.bench.server_process import DEFAULT_LLM_DIR, DEFAULT_MODEL_DIR
from tests.support.worker_groups import group_for_workers


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


# Test tiers, one marker each test gets from its module: `system` needs what `make test` installs
# beside the venv (Docker, Prometheus, Triton, perf_analyzer, apt); `integration` starts a process
# (a real server on a socket, a CLI, a child interpreter); `unit` runs in this process.
# `make test-fast` runs the unit tier; `make test` runs them all.
SYSTEM_MODULES = {
    "tests/deploy/test_apt_install.py",
    "tests/deploy/test_compose.py",
    "tests/deploy/test_dashboards.py",
    "tests/deploy/test_docker_stack.py",
    "tests/deploy/test_gpu_panels.py",
    "tests/deploy/test_install_scripts.py",
    "tests/deploy/test_live_dashboards.py",
    "tests/deploy/test_live_llm_triton.py",
    "tests/deploy/test_prometheus_rules.py",
    "tests/server/test_console_browser.py",
    "tests/server/test_perf_analyzer.py",
    "tests/server/test_tracing_live.py",
    "tests/triton/test_predict_on_triton.py",
    "tests/triton/test_tensorrt_gpu.py",
}
_PROCESS_WORDS = ("subprocess", "multiprocessing", "Popen", "_server(", "server_process")
_REPO = Path(__file__).resolve().parents[1]


def _starts_a_process(source: str) -> bool:
    return any(word in source for word in _PROCESS_WORDS)


def _tier(item: pytest.Item, modules: dict[Path, str]) -> str:
    path = Path(item.fspath)
    if path.relative_to(_REPO).as_posix() in SYSTEM_MODULES:
        return "system"
    if path not in modules:
        modules[path] = path.read_text()
    if _starts_a_process(modules[path]):
        return "integration"
    # A fixture defined elsewhere (a conftest) may start the server the test talks to.
    for defs in item._fixtureinfo.name2fixturedefs.values():  # type: ignore[attr-defined]
        for fixture in defs:
            source_file = inspect.getsourcefile(fixture.func) or ""
            if source_file.startswith(str(_REPO / "tests")) and _starts_a_process(
                inspect.getsource(fixture.func)
            ):
                return "integration"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[Path, str] = {}
    for item in items:
        item.add_marker(getattr(pytest.mark, _tier(item, modules)))
    group_for_workers(items, _REPO)
