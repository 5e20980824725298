"""Fixtures for the tests that run the committed tiny model for real (no mocks): the LLM engine's
and the OpenAI serving layer's. Each of their conftest.py files imports them by name. Also the
real SmolLM2's decoder on onnxruntime, with three short chat prompts, for the batch lane's tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.ortgenai import OrtGenAIEngine
from ferry.llm.ortgenai_kv import KVModel
from tests.llm.llm_paths import MODEL_NAME, ONNX_DIR, REAL_MODEL, TINY_LLM

QUESTIONS = ("What is the capital of France?", "Name a primary colour.", "What do bees make?")


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    return json.loads((TINY_LLM / "greedy_reference.json").read_text())


@pytest.fixture
async def engine() -> AsyncIterator[OrtGenAIEngine]:
    eng = OrtGenAIEngine(ONNX_DIR, name=MODEL_NAME)
    await eng.start()
    yield eng
    await eng.close()


@pytest.fixture(scope="session")
def kv_model() -> KVModel:
    assert (REAL_MODEL / "genai_config.json").is_file(), "run `make model` first"
    return KVModel(REAL_MODEL)


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    """QUESTIONS as SmolLM2 chat prompts (different lengths)."""
    chat = ChatTokenizer(REAL_MODEL)
    return [chat.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
