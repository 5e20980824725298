"""`ferry export vision`: ResNet-18 (or a module by path) with random or local weights, exported
with its preprocessing in the graph's metadata and compared with torch, then served as is."""

from __future__ import annotations

import json

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch

from ferry.bench.server_process import ferry_server
from ferry.cli import main
from ferry.exporters import vision_export
from tests.support import images

pytestmark = pytest.mark.integration


def metadata(path) -> dict:
    session = ort.InferenceSession(str(path))
    return json.loads(session.get_modelmeta().custom_metadata_map["ferry.preprocess"])


def test_resnet18_at_224_matches_torch_and_declares_imagenet_preprocessing(tmp_path, capsys):
    out = tmp_path / "resnet18.onnx"
    assert main(["export", "vision", "--out", str(out)]) == 0
    said = capsys.readouterr()
    report = said.out
    steps = [line.partition(" in ")[0] for line in said.err.splitlines()]
    assert steps == [
        "ferry export vision: building resnet18",
        "ferry export vision: exporting to ONNX",
        "ferry export vision: comparing with torch",
    ]
    assert "parity on 4 random images against torch" in report and "  ok" in report
    session = ort.InferenceSession(str(out))
    (pixels,) = session.get_inputs()
    assert (pixels.name, pixels.shape) == ("pixel_values", ["batch", 3, 224, 224])
    assert session.get_outputs()[0].shape == ["batch", 1000]
    declared = metadata(out)
    assert (declared["resize"], declared["crop"], declared["layout"]) == (256, 224, "NCHW")
    assert declared["mean"] == list(vision_export.IMAGENET_MEAN)


def test_local_weights_are_the_ones_exported(tmp_path):
    trained = vision_export.build("resnet18", 3, 4, None, seed=1)
    weights = tmp_path / "weights.pt"
    torch.save(trained.state_dict(), weights)
    out = tmp_path / "model.onnx"
    argv = ["export", "vision", "--width", "4", "--num-classes", "3", "--size", "32"]
    assert main([*argv, "--weights", str(weights), "--seed", "0", "--out", str(out)]) == 0
    pixels = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    (got,) = ort.InferenceSession(str(out)).run(None, {"pixel_values": pixels})
    with torch.no_grad():
        want = trained(torch.from_numpy(pixels)).numpy()
        random = vision_export.build("resnet18", 3, 4, None, seed=0)(torch.from_numpy(pixels))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, random.numpy(), atol=1e-3)  # not the seed's random weights


def test_a_module_by_path_is_exported_and_served_decoding_jpeg(tmp_path, capsys):
    out = tmp_path / "tiny.onnx"
    arch = "tests.exporters.tiny_vision:build"
    argv = ["export", "vision", "--arch", arch, "--size", "32", "--resize", "40"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "  ok" in capsys.readouterr().out
    data = images.encoded(3)
    expected = ort.InferenceSession(str(out)).run(
        None, {"pixel_values": images.reference(data, 32, 40)[None]}
    )[0]
    with ferry_server([], args=["--model", f"tiny={out}"]) as server:
        reply = httpx.post(
            f"{server.url}/predict?model=tiny", content=data, headers={"content-type": "image/jpeg"}
        )
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(
        reply.json()["outputs"][0]["logits"], expected[0], rtol=1e-4, atol=1e-5
    )


def test_resnet18s_own_options_are_refused_for_another_module(tmp_path):
    argv = ["export", "vision", "--arch", "tests.exporters.tiny_vision:build", "--width", "8"]
    with pytest.raises(SystemExit, match="resnet18's only"):
        main([*argv, "--out", str(tmp_path / "m.onnx")])
