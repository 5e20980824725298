"""Triton model repositories: configs mirror the batcher; triton_models/ is the exporter's."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.exporters.triton_repo import PYTHON_MODEL, Batching, write_repository
from tests.exporters.triton_models import FLAVOURS, GENERATED, NAME, TRITON_MODELS, export_default

pytestmark = pytest.mark.unit


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


@pytest.mark.parametrize("folder", sorted(FLAVOURS))
def test_committed_triton_models_match_the_exporter(default_model_dir, tmp_path, folder):
    written = export_default(default_model_dir, tmp_path, folder, config_only=True)
    committed = TRITON_MODELS / folder / NAME

    def files(root: Path) -> set[str]:
        paths = (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        return {p for p in paths if p not in GENERATED}

    assert files(written) == files(committed) == {"config.pbtxt"}
    assert (committed / "config.pbtxt").read_text() == (written / "config.pbtxt").read_text()
    # The python flavour's model.py is written by the exporter, never committed a second time.
    model_py = written / "1" / "model.py"
    if folder == "cpu":
        assert model_py.read_text() == PYTHON_MODEL.read_text()
    else:
        assert not model_py.exists()
