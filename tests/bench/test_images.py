"""bench.images' request bodies: the same tensors to every server, JPEGs of many sizes."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from ferry.bench import images

pytestmark = pytest.mark.unit


def test_jpeg_bodies_are_base64_jpegs_of_mixed_sizes():
    sizes = set()
    for body in images.jpeg_bodies():
        (tensor,) = body["inputs"]
        assert (tensor["datatype"], tensor["shape"]) == ("BYTES", [1])
        image = Image.open(io.BytesIO(base64.b64decode(tensor["data"][0])))
        assert image.format == "JPEG"
        sizes.add(image.size)
    assert len(sizes) >= len(images.CROPS)


def test_tensor_bodies_are_one_fp32_image_each():
    (tensor,) = images.tensor_bodies()[0]["inputs"]
    assert tensor["shape"] == [1, 3, images.SIZE, images.SIZE]
    assert len(tensor["data"]) == 3 * images.SIZE * images.SIZE
