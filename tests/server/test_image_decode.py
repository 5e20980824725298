"""One encoded image to one row of the graph's input, against a reference preprocessing written
apart (tests/support/images.py); every image that cannot be decoded refused naming the item."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from ferry.backends.image_spec import ImagePreprocess, plan
from ferry.backends.tensor_signature import Signature, TensorSpec
from ferry.server.errors import InvalidInput
from ferry.server.image_decode import decode_image
from tests.support import images

pytestmark = pytest.mark.unit


def image_plan(shape=(3, images.SIZE, images.SIZE), datatype="FP32", **fields):
    signature = Signature((TensorSpec("pixels", datatype, ("batch", *shape)),), ())
    spec = {**images.PREPROCESS, **fields}
    return plan(ImagePreprocess(**spec), signature)


@pytest.mark.parametrize("index", range(len(images.CROPS) * 2))
@pytest.mark.parametrize(
    ("fmt", "mode"), [("JPEG", "RGB"), ("PNG", "RGB"), ("PNG", "RGBA"), ("PNG", "L")]
)
def test_every_size_and_mode_matches_the_reference(index, fmt, mode):
    data = images.encoded(index, fmt, mode)
    row = decode_image(data, image_plan(), "pixels[0]")
    assert row.dtype == np.float32 and row.shape == (3, images.SIZE, images.SIZE)
    np.testing.assert_allclose(row, images.reference(data), atol=1e-5)


def test_base64_decodes_to_the_same_row():
    data = images.encoded(1)
    as_text = base64.b64encode(data).decode()
    np.testing.assert_array_equal(
        decode_image(as_text, image_plan(), "x"), decode_image(data, image_plan(), "x")
    )


def test_nhwc_fp16_and_uint8_layouts():
    data = images.encoded(2)
    nchw = decode_image(data, image_plan(), "x")
    nhwc = decode_image(data, image_plan(shape=(images.SIZE, images.SIZE, 3), datatype="FP16"), "x")
    assert nhwc.dtype == np.float16
    np.testing.assert_allclose(nhwc.transpose(2, 0, 1), nchw, atol=1e-2)
    raw = image_plan(
        shape=(images.SIZE, images.SIZE, 3), datatype="UINT8", scale=1, mean=[0] * 3, std=[1] * 3
    )
    pixels = decode_image(data, raw, "x")
    assert pixels.dtype == np.uint8
    np.testing.assert_allclose((pixels / 255 - images.MEAN) / images.STD, nhwc, atol=1e-2)


@pytest.mark.parametrize(
    ("item", "says"),
    [
        (b"not an image at all", "not a JPEG or PNG image"),
        (images.encoded(0)[:300], "cannot be decoded"),  # a truncated JPEG
        ("%%% not base64", "base64"),
        (12, "JPEG or PNG bytes"),
    ],
)
def test_bad_images_are_refused_naming_the_item(item, says):
    with pytest.raises(InvalidInput, match=says) as refused:
        decode_image(item, image_plan(), "pixels[3]")
    assert refused.value.field == "pixels[3]"


def test_other_formats_are_refused():
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (40, 40)).save(buffer, "GIF")
    with pytest.raises(InvalidInput, match="not a JPEG or PNG"):
        decode_image(buffer.getvalue(), image_plan(), "x")


def test_an_image_too_large_is_refused_from_its_header():
    data = images.encoded(0)  # 640 x 427
    with pytest.raises(InvalidInput, match="640x427, more than max_pixels"):
        decode_image(data, image_plan(max_pixels=640 * 427 - 1), "x")


@pytest.mark.parametrize(
    ("make", "width", "height", "says"),
    [
        (images.png_header, 1, 40_000_000, "1x40000000, a side longer than max_side"),
        (images.png_header, 39_000_000, 1, "39000000x1, a side longer than max_side"),
        (images.png_header, 1, 39_000_000, "1x39000000, a side longer than max_side"),
        (images.blank_png, 100, 399_000, "100x399000, a side longer than max_side"),
        (images.png_header, 70_000, 500, "a side longer than max_side"),
        (images.blank_png, 100, 6_401, r"100x6401, its longer side more than max_aspect_ratio \("),
        (images.blank_png, 6_401, 100, "its longer side more than max_aspect_ratio"),
    ],
)
def test_a_long_or_thin_image_is_refused_from_its_header(make, width, height, says):
    # A long side times the resize makes the resized image (256 x 1,021,440 for the 100 x
    # 399,000 one, ~1 GB); a bomb's header claims pixels its bytes never hold.
    with pytest.raises(InvalidInput, match=says) as refused:
        decode_image(make(width, height), image_plan(), "pixels[2]")
    assert refused.value.field == "pixels[2]"


def test_the_side_and_aspect_bounds_are_configurable():
    data = images.blank_png(100, 6_401)
    assert decode_image(data, image_plan(max_aspect_ratio=65), "x").shape == (3, 32, 32)
    with pytest.raises(InvalidInput, match=r"max_side \(6400\)"):
        decode_image(data, image_plan(max_aspect_ratio=65, max_side=6_400), "x")
