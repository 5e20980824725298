"""Triton model repositories: configs mirror the batcher; triton_models/ matches the exporter."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.exporters.triton_repo import Batching, write_repository
from ferry.server.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_python_flavour_config(default_model_dir, tmp_path):
    folder = write_repository(
        default_model_dir, tmp_path, "python", Batching(16, 0.0025, instances=2), name="m"
    )
    config = (folder / "config.pbtxt").read_text()
    assert 'backend: "python"' in config
    assert "max_batch_size: 16" in config
    assert "preferred_batch_size: [ 16 ]" in config
    assert "max_queue_delay_microseconds: 2500" in config
    assert "instance_group [ { count: 2 kind: KIND_CPU } ]" in config
    # Without ragged batching Triton would only merge requests of equal length.
    assert config.count("allow_ragged_batch: true") == 2
    assert '{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 384 ] }' in config
    assert (folder / "1" / "model.py").exists() and (folder / "1" / "model.onnx").exists()


@pytest.mark.parametrize(
    ("flavour", "platform", "weights"),
    [("onnxruntime", "onnxruntime_onnx", "model.onnx"), ("tensorrt", "tensorrt_plan", None)],
)
def test_gpu_flavours(default_model_dir, tmp_path, flavour, platform, weights):
    folder = write_repository(default_model_dir, tmp_path, flavour, Batching(), name="m")
    config = (folder / "config.pbtxt").read_text()
    assert f'platform: "{platform}"' in config
    assert "kind: KIND_GPU" in config and "allow_ragged_batch" not in config
    assert sorted(p.name for p in (folder / "1").iterdir()) == ([weights] if weights else [])


@pytest.mark.parametrize("flavour", ["cpu", "onnxruntime", "tensorrt"])
def test_committed_triton_models_match_the_exporter(default_model_dir, tmp_path, flavour):
    name = "all-MiniLM-L6-v2"
    args = [
        "export",
        "triton",
        "--model-dir",
        str(default_model_dir),
        "--repository",
        str(tmp_path),
        "--flavour",
        "python" if flavour == "cpu" else flavour,
        "--name",
        name,
        "--config",
        str(REPO / "ferry.toml"),
        "--config-only",
    ]
    assert main(args) == 0
    committed = REPO / "triton_models" / flavour / name
    for path in (tmp_path / name).rglob("*"):
        if path.is_file():
            relative = path.relative_to(tmp_path / name)
            assert (committed / relative).read_text() == path.read_text(), relative
