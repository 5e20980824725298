from __future__ import annotations

import openai
import pytest

from ferry.bench.server_process import REPO, ferry_server

SMOL = "SmolLM2-135M-Instruct"
SMOL_DIR = REPO / "artifacts" / "models" / SMOL


@pytest.fixture(scope="package")
def smol_server():
    """One server on the real default chat model for the structured-output and Responses
    modules (pointing at the artifact directly, whatever the default config serves)."""
    model = {"name": SMOL, "engine": "ortgenai", "path": str(SMOL_DIR), "max_running": 4}
    with ferry_server(llm_models=[model]) as handle:
        yield handle


@pytest.fixture(scope="package")
def smol_client(smol_server):
    return openai.OpenAI(base_url=f"{smol_server.url}/v1", api_key="unused", max_retries=0)
