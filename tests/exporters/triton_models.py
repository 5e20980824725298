"""The default model's Triton repositories (triton_models/), as `make triton-models` writes them.

Only each flavour's config.pbtxt is committed; model.py (the python flavour's) and the weights
are written by the exporter on the host.
"""

from __future__ import annotations

from pathlib import Path

from ferry.cli import main

ROOT = Path(__file__).resolve().parents[2]
TRITON_MODELS = ROOT / "triton_models"
NAME = "all-MiniLM-L6-v2"
# triton_models/ folder -> the exporter's --flavour
FLAVOURS = {"cpu": "python", "onnxruntime": "onnxruntime", "tensorrt": "tensorrt"}
# What the exporter writes that is not committed (.gitignore).
GENERATED = frozenset({"1/model.py", "1/model.onnx", "1/model.plan"})


def export_default(model_dir: Path, repository: Path, folder: str, config_only: bool) -> Path:
    """`ferry export triton` of the default model with ferry.toml's batching; the model folder."""
    args = ["export", "triton", "--model-dir", str(model_dir), "--repository", str(repository)]
    args += ["--flavour", FLAVOURS[folder], "--name", NAME, "--config", str(ROOT / "ferry.toml")]
    assert main([*args, "--config-only"] if config_only else args) == 0
    return repository / NAME
