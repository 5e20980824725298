from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ferry.exporters.llm_export import export_llm
from tests.exporters.tiny_llms import MATRIX, build_tiny_llm

# Each export is mostly onnxruntime-genai's builder in a child process (its imports alone take
# seconds), so a few run at once; more would only compete for memory.
_PARALLEL_EXPORTS = min(4, os.cpu_count() or 1)


@pytest.fixture(scope="session")
def tiny_llm_exports(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each architecture of the matrix: (its Hugging Face folder, its fp32 export), by name."""
    root = tmp_path_factory.mktemp("tiny-llms")
    # Built one after another: each seeds torch's one global generator.
    folders = {name: build_tiny_llm(spec, root / name / "hf") for name, spec in MATRIX.items()}
    with ThreadPoolExecutor(_PARALLEL_EXPORTS) as pool:
        exports = pool.map(
            lambda name: export_llm(root / name / "onnx", "fp32", hf=folders[name]), folders
        )
        return {name: (folders[name], out) for name, out in zip(folders, exports, strict=True)}
