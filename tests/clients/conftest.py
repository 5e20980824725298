from __future__ import annotations

import pytest

from ferry.bench.server_process import ferry_server
from tests.clients.frameworks.wire import Wire, recording
from tests.support.llm_configs import default_llm_config


@pytest.fixture(scope="package")
def llm_server(default_llm_dir):
    """One server on the default chat model (SmolLM2) for every client of this folder."""
    with ferry_server(models=[], llm_models=[default_llm_config()]) as handle:
        yield handle


@pytest.fixture(scope="package")
def offline_clients(tmp_path_factory):
    """What litellm and dspy read when imported: litellm's bundled model table (not a download
    that fails offline) and a dspy cache folder of the test's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        patch.setenv("DSPY_CACHEDIR", str(tmp_path_factory.mktemp("dspy")))
        yield


@pytest.fixture
def wire(monkeypatch) -> Wire:
    return recording(monkeypatch)
