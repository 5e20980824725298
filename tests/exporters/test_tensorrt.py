"""TensorRT plan building: the profile follows the batcher, the command is exact, no GPU -> 3."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.cli import main
from ferry.exporters.tensorrt import EXIT_NO_GPU, derive_profile, gpu_present, trtexec_command

pytestmark = pytest.mark.unit


def test_profile_spans_one_token_to_the_batchers_limits():
    profile = derive_profile(max_batch_size=32, max_length=256)
    assert (profile.min, profile.opt, profile.max) == ((1, 1), (32, 128), (32, 256))


def test_opt_length_never_exceeds_max_length():
    assert derive_profile(8, 64).opt == (8, 64)


def test_invalid_limits_are_refused():
    with pytest.raises(ValueError):
        derive_profile(0, 128)


def test_trtexec_command_text():
    command = trtexec_command(Path("m/model.onnx"), Path("m.plan"), derive_profile(16, 256))
    assert command == [
        "trtexec",
        "--onnx=m/model.onnx",
        "--saveEngine=m.plan",
        "--minShapes=input_ids:1x1,attention_mask:1x1",
        "--optShapes=input_ids:16x128,attention_mask:16x128",
        "--maxShapes=input_ids:16x256,attention_mask:16x256",
        "--memPoolSize=workspace:4096M",
        "--fp16",
    ]


@pytest.mark.skipif(gpu_present(), reason="checks the no-GPU path")
def test_without_gpu_the_cli_prints_the_command_and_exits_3(default_model_dir, tmp_path, capsys):
    config = tmp_path / "ferry.toml"
    config.write_text(
        f'[[models]]\nname = "m"\npath = "{default_model_dir}"\n'
        "batching = { max_batch_size = 8 }\n"
    )
    code = main(
        [
            "export",
            "tensorrt",
            "--model-dir",
            str(default_model_dir),
            "--out",
            str(tmp_path / "m.plan"),
            "--config",
            str(config),
        ]
    )
    assert code == EXIT_NO_GPU
    err = capsys.readouterr().err
    assert "no NVIDIA GPU" in err
    assert "--maxShapes=input_ids:8x256,attention_mask:8x256" in err
    assert not (tmp_path / "m.plan").exists()
