"""Fixtures for the tests that run the committed tiny model for real (no mocks): the LLM engine's
and the OpenAI serving layer's. Each of their conftest.py files imports them by name."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ferry.llm.ortgenai import OrtGenAIEngine
from tests.llm.llm_paths import MODEL_NAME, ONNX_DIR, TINY_LLM


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    return json.loads((TINY_LLM / "greedy_reference.json").read_text())


@pytest.fixture
async def engine() -> AsyncIterator[OrtGenAIEngine]:
    eng = OrtGenAIEngine(ONNX_DIR, name=MODEL_NAME)
    await eng.start()
    yield eng
    await eng.close()
