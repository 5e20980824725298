"""One encoded image to one row of a model's input: a pure function, run in a worker thread.

As torchvision's Resize + CenterCrop + ToTensor + Normalize: the shorter side resized to the
plan's `resize` (the longer one truncated in proportion), the centre cropped, values scaled and
normalised per channel. Only JPEG and PNG are opened, and an image whose header claims more
than `max_pixels`, a side longer than `max_side` or a longer side over `max_aspect_ratio` times
the shorter is refused before a pixel is decoded. Every refusal names the request's item.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from ferry.backends.image_spec import ImagePlan
from ferry.server.errors import InvalidInput

FORMATS = ("JPEG", "PNG")
RESAMPLE = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}


def encoded_bytes(item: object, where: str) -> bytes:
    """The image's bytes: binary as sent, or a string of base64 (JSON)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        try:
            return base64.b64decode(item, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput(where, "an image in JSON must be a base64 string") from None
    raise InvalidInput(where, "an image must be JPEG or PNG bytes (base64 in JSON)")


def decode_image(item: object, plan: ImagePlan, where: str) -> np.ndarray:
    """The image as the graph input's row: [3, H, W] (NCHW) or [H, W, 3] (NHWC)."""
    data = encoded_bytes(item, where)
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            _check_size(image.size, plan, where)
            rgb = image.convert("RGB")  # decodes (the GIL released), drops alpha, expands palettes
    except UnidentifiedImageError:
        raise InvalidInput(where, "not a JPEG or PNG image") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise InvalidInput(where, f"the image cannot be decoded: {exc}") from None
    pixels = np.asarray(_resized_centre(rgb, plan))
    if plan.datatype == "UINT8":
        values = pixels
    else:
        values = pixels.astype(np.float32) * plan.scale + plan.shift
    if plan.layout == "NCHW":
        values = values.transpose(2, 0, 1)
    return np.ascontiguousarray(values, dtype=plan.dtype)


def _check_size(size: tuple[int, int], plan: ImagePlan, where: str) -> None:
    """The header's size within the plan's bounds: a few bytes of PNG can claim any size, and
    a long thin one is resized to a long side of `resize` times its aspect ratio."""
    width, height = size
    if width * height > plan.max_pixels:
        raise InvalidInput(
            where, f"the image is {width}x{height}, more than max_pixels ({plan.max_pixels})"
        )
    if max(size) > plan.max_side:
        raise InvalidInput(
            where, f"the image is {width}x{height}, a side longer than max_side ({plan.max_side})"
        )
    if max(size) > plan.max_aspect_ratio * max(min(size), 1):
        raise InvalidInput(
            where,
            f"the image is {width}x{height}, its longer side more than max_aspect_ratio "
            f"({plan.max_aspect_ratio:g}) times the shorter",
        )


def _resized_centre(image: Image.Image, plan: ImagePlan) -> Image.Image:
    width, height = image.size
    short, long = plan.resize, int(plan.resize * max(width, height) / min(width, height))
    size = (short, long) if width <= height else (long, short)
    if size != image.size:
        image = image.resize(size, RESAMPLE[plan.resample])
    top = round((size[1] - plan.height) / 2)  # torchvision's centre_crop offsets
    left = round((size[0] - plan.width) / 2)
    return image.crop((left, top, left + plan.width, top + plan.height))
