"""Where the committed tiny model lives, for the LLM tests (a plain module: importable by name)."""

from __future__ import annotations

from pathlib import Path

TINY_LLM = Path(__file__).resolve().parents[2] / "models" / "tiny-llm"
ONNX_DIR = TINY_LLM / "onnx"
HF_DIR = TINY_LLM / "hf"
MODEL_NAME = "tiny-llm"
WAIT_S = 30  # every await on the engine is bounded by this
ADAPTERS_DIR = TINY_LLM / "adapters"
# The real default chat model (SmolLM2-135M-Instruct, int4 CPU), made by `make model`.
REAL_MODEL = Path(__file__).resolve().parents[2] / "artifacts" / "models" / "SmolLM2-135M-Instruct"
ADAPTER_NAMES = ("zen", "shout")


def onnx_adapter(name: str) -> Path:
    return ADAPTERS_DIR / name / f"{name}.onnx_adapter"
