"""An image model's declared preprocessing checked against its graph at start: every size,
layout and dtype fixed, and each declaration that cannot fit the graph refused, saying why."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ferry.backends.image_spec import (
    METADATA_KEY,
    ImagePreprocess,
    declared,
    manifest_preprocess,
    plan,
)
from ferry.backends.manifest import MANIFEST_NAME
from ferry.backends.tensor_signature import Signature, TensorSpec

pytestmark = pytest.mark.unit


def graph(*shape, datatype: str = "FP32", more: tuple[TensorSpec, ...] = ()) -> Signature:
    image = TensorSpec("pixels", datatype, ("batch", *shape))
    return Signature((image, *more), (TensorSpec("logits", "FP32", ("batch", 10)),))


def test_layout_crop_and_resize_come_from_the_graph():
    nchw = plan(ImagePreprocess(), graph(3, 224, 200))
    assert (nchw.input, nchw.layout, nchw.height, nchw.width, nchw.resize) == (
        "pixels",
        "NCHW",
        224,
        200,
        224,
    )
    assert plan(ImagePreprocess(), graph(96, 96, 3)).layout == "NHWC"


def test_mean_and_std_fold_into_one_scale_and_shift():
    spec = ImagePreprocess(scale=0.5, mean=(1, 2, 3), std=(2, 4, 8))
    folded = plan(spec, graph(3, 8, 8))
    pixel = np.array([10.0, 10.0, 10.0], dtype=np.float32)
    expected = (pixel * 0.5 - np.array([1, 2, 3])) / np.array([2, 4, 8])
    np.testing.assert_allclose(pixel * folded.scale + folded.shift, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("spec", "signature", "says"),
    [
        (ImagePreprocess(), graph(3, "h", "w"), "set preprocess.crop"),
        (ImagePreprocess(), graph(3, 8, 3), "set preprocess.layout"),
        (ImagePreprocess(layout="NCHW"), graph(4, 8, 8), "4 channels"),
        (ImagePreprocess(crop=32), graph(3, 8, 8), "does not fit"),
        (ImagePreprocess(crop=32, resize=16), graph(3, "h", "w"), "smaller than the crop"),
        (ImagePreprocess(), graph(3, 8, 8, datatype="INT64"), "must be one of"),
        (ImagePreprocess(), graph(3, 8, 8, datatype="UINT8"), "set scale = 1"),
        (ImagePreprocess(input="nope"), graph(3, 8, 8), "not among the graph's inputs"),
        (
            ImagePreprocess(),
            graph(3, 8, 8, more=(TensorSpec("mask", "FP32", ("batch", 1, 8, 8)),)),
            "2 4-D inputs",
        ),
        (ImagePreprocess(std=(1, 0, 1)), graph(3, 8, 8), "std must not be 0"),
    ],
)
def test_a_declaration_that_cannot_fit_the_graph_is_refused(spec, signature, says):
    with pytest.raises(ValueError, match=says):
        plan(spec, signature)


def test_uint8_pixels_pass_unscaled():
    assert plan(ImagePreprocess(scale=1), graph(8, 8, 3, datatype="UINT8")).datatype == "UINT8"


def test_the_configs_fields_win_over_the_graphs():
    metadata = {METADATA_KEY: json.dumps({"resize": 256, "crop": 224, "mean": [0.5] * 3})}
    merged = declared(metadata, ImagePreprocess(resize=300))
    assert (merged.resize, merged.crop, merged.mean) == (300, 224, (0.5, 0.5, 0.5))
    assert declared({}, None) is None
    assert declared(metadata, None).resize == 256


def test_the_manifest_sits_between_the_graph_and_the_config():
    metadata = {METADATA_KEY: json.dumps({"resize": 256, "crop": 224, "scale": 0.5})}
    manifest = {"resize": 300, "crop": 200}
    merged = declared(metadata, ImagePreprocess(crop=100), manifest)
    assert (merged.resize, merged.crop, merged.scale) == (300, 100, 0.5)
    assert declared({}, None, {"crop": 64}).crop == 64
    with pytest.raises(ValueError, match=f"{MANIFEST_NAME}'s preprocess is not valid"):
        declared({}, None, {"crop": "big"})


def test_an_image_folders_manifest_declares_its_preprocessing(tmp_path):
    manifest = tmp_path / MANIFEST_NAME
    assert manifest_preprocess(tmp_path) is None  # no manifest
    manifest.write_text(json.dumps({"task": "image", "preprocess": {"crop": 64}}))
    assert manifest_preprocess(tmp_path) == {"crop": 64}
    assert manifest_preprocess(manifest) is None  # a file, not a folder
    manifest.write_text(json.dumps({"task": "embedding", "max_length": 8, "vocab_size": 9}))
    assert manifest_preprocess(tmp_path) is None  # a token encoder's
    manifest.write_text(json.dumps({"task": "image", "preprocess": [64]}))
    with pytest.raises(ValueError, match="preprocess must be an object"):
        manifest_preprocess(tmp_path)
    manifest.write_text("{not json")
    with pytest.raises(ValueError, match=f"{MANIFEST_NAME} is not JSON"):
        manifest_preprocess(tmp_path)


def test_the_exporters_metadata_reads_back_as_written():
    spec = ImagePreprocess(input="pixels", resize=256, crop=224, layout="NCHW", workers=3)
    back = declared({METADATA_KEY: spec.to_metadata()}, None)
    assert back == spec.model_copy(update={"workers": None})  # a server setting, not the model's


@pytest.mark.parametrize("raw", ["not json", json.dumps({"crop": "big"}), json.dumps({"x": 1})])
def test_unreadable_graph_metadata_is_refused_naming_the_entry(raw):
    with pytest.raises(ValueError, match=METADATA_KEY):
        declared({METADATA_KEY: raw}, None)
