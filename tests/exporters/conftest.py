from __future__ import annotations

from pathlib import Path

import pytest

from ferry.exporters.llm_export import build_genai_all
from tests.exporters.tiny_llms import MATRIX, build_tiny_llm
from tests.llm.llm_paths import HF_DIR, MODEL_NAME


@pytest.fixture(scope="session")
def fp32_exports(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """The committed tiny Llama (MODEL_NAME) and each architecture of the matrix: (its Hugging
    Face folder, its fp32 export), by name."""
    root = tmp_path_factory.mktemp("tiny-llms")
    # Built one after another: each seeds torch's one global generator.
    folders = {name: build_tiny_llm(spec, root / name / "hf") for name, spec in MATRIX.items()}
    folders[MODEL_NAME] = HF_DIR
    # One builder process for all: importing the builder is most of each export's time.
    jobs = [(hf, root / name / "onnx") for name, hf in folders.items()]
    exports = build_genai_all(jobs, "fp32")
    return {name: (folders[name], out) for name, out in zip(folders, exports, strict=True)}


@pytest.fixture(scope="session")
def tiny_llm_exports(fp32_exports) -> dict[str, tuple[Path, Path]]:
    """Each architecture of the matrix: (its Hugging Face folder, its fp32 export), by name."""
    return {name: fp32_exports[name] for name in MATRIX}
