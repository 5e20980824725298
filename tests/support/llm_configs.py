"""`[[llm_models]]` entries for `ferry_server`: the committed tiny LLM and the default chat LLM."""

from __future__ import annotations

from typing import Any

from ferry.bench.server_process import DEFAULT_LLM, DEFAULT_LLM_DIR, TINY_LLM, TINY_LLM_DIR


def tiny_llm_config(**overrides: Any) -> dict[str, Any]:
    return {"name": TINY_LLM, "engine": "ortgenai", "path": str(TINY_LLM_DIR), **overrides}


def default_llm_config(**overrides: Any) -> dict[str, Any]:
    return {"name": DEFAULT_LLM, "engine": "ortgenai", "path": str(DEFAULT_LLM_DIR), **overrides}
