"""Images for the image-model tests: scikit-learn's bundled sample photos (china.jpg, flower.jpg)
cropped to several sizes and encoded as JPEG or PNG, a small CNN graph with random weights, and
a reference preprocessing written apart from Ferry's (torchvision's Resize + CenterCrop +
ToTensor + Normalize, in float64) to check Ferry's against."""

from __future__ import annotations

import io
import json
from functools import cache
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

SIZE = 32  # the tiny CNN's crop
RESIZE = 40
CLASSES = 5
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
PREPROCESS = {"resize": RESIZE, "crop": SIZE, "mean": list(MEAN), "std": list(STD)}
# (height, width) crops of the 427 x 640 samples: landscape, portrait, square, smaller than
# the crop (scaled up), and odd sizes.
CROPS = ((427, 640), (300, 200), (97, 97), (20, 31), (255, 129), (64, 400))


@cache
def samples() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_sample_images

    return tuple(load_sample_images().images)


def encoded(index: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    """Sample image `index` (cycling through photos and crops), encoded."""
    photo = samples()[index % 2]
    height, width = CROPS[index % len(CROPS)]
    top, left = (
        (index * 7) % (photo.shape[0] - height + 1),
        (index * 13) % (photo.shape[1] - width + 1),
    )
    image = Image.fromarray(photo[top : top + height, left : left + width]).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def reference(
    data: bytes, size: int = SIZE, resize: int = RESIZE, mean=MEAN, std=STD
) -> np.ndarray:
    """[3, size, size] FP32, as torchvision would make it."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = image.size
    if width <= height:
        scaled = (resize, int(resize * height / width))
    else:
        scaled = (int(resize * width / height), resize)
    pixels = np.asarray(image.resize(scaled, Image.Resampling.BILINEAR), dtype=np.float64)
    top = round((scaled[1] - size) / 2.0)
    left = round((scaled[0] - size) / 2.0)
    pixels = pixels[top : top + size, left : left + size] / 255.0
    normalised = (pixels - np.array(mean)) / np.array(std)
    return normalised.transpose(2, 0, 1).astype(np.float32)


def tiny_cnn(path: Path, declare: bool = True, spatial: tuple = (SIZE, SIZE)) -> Path:
    """pixel_values [batch, 3, 32, 32] FP32 -> logits [batch, 5]: a convolution, ReLU, global
    average pool and a dense layer, random weights; `declare`: its preprocessing in the graph's
    metadata (as `ferry export vision` writes it), else left to the config; `spatial`: its
    height and width, sizes or the names of dynamic axes."""
    rng = np.random.default_rng(7)
    weights = {
        "conv_w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "conv_b": rng.standard_normal(8).astype(np.float32),
        "fc_w": rng.standard_normal((8, CLASSES)).astype(np.float32),
        "fc_b": rng.standard_normal(CLASSES).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["pixel_values", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, *spatial])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if declare:
        helper.set_model_props(model, {"ferry.preprocess": json.dumps(PREPROCESS)})
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def png_header(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims `width` x `height` (grey, 8 bits) and
    whose one IDAT holds almost nothing: what a decompression bomb's header looks like."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 100)
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def blank_png(width: int, height: int) -> bytes:
    """A real black PNG (grey) of `width` x `height`: a long thin one compresses to little."""
    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, "PNG")
    return buffer.getvalue()
