"""An image model's preprocessing: what it declares, and that declaration checked against its graph.

A model declares it in the graph's metadata (`ferry.preprocess`, a JSON object of the fields
below, written by `ferry export vision`), in its folder's `ferry_model.json` (`{"task": "image",
"preprocess": {...}}`) or in its `[[models]]` entry (`preprocess`); each one's fields win over
the one before. Resolved once at start against the graph's image input
into an `ImagePlan`: every size, layout and dtype fixed, so decoding never has to guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ferry.backends.manifest import MANIFEST_NAME
from ferry.backends.tensor_signature import Signature, TensorSpec

METADATA_KEY = "ferry.preprocess"  # the graph's metadata_props entry
# An image model's folder: model.onnx and a ferry_model.json of this task, its preprocessing.
IMAGE_TASK = "image"
# Graph datatypes a decoded image can become: floats after scaling, or the raw 0..255 bytes.
IMAGE_DATATYPES = ("FP16", "FP32", "FP64", "UINT8")
CHANNELS = 3  # decoded images are converted to RGB
# Past this, an image is refused from its header, before a pixel is decoded (a PNG of a few
# kilobytes can claim gigapixels).
MAX_PIXELS = 40_000_000
# Nor may a side be longer than JPEG's own limit, or the longer side more than this many times
# the shorter: a PNG of 100 x 399,000 (5.5 KB) took 1.3-1.6 GB to decode and resize.
MAX_SIDE = 65_535
MAX_ASPECT_RATIO = 64.0

Triple = tuple[float, float, float]


class ImagePreprocess(BaseModel):
    """Decode (JPEG or PNG), convert to RGB, resize the shorter side to `resize`, centre-crop to
    `crop`, then `value * scale`, minus `mean`, over `std` (per channel, RGB order)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str | None = None  # The graph input it fills; None: the graph's only 4-D input.
    # The shorter side's length before cropping; None: the crop's longer side.
    resize: int | None = Field(default=None, ge=1)
    # The centre crop, a side or (height, width); None: the graph's fixed height and width.
    crop: int | tuple[int, int] | None = None
    # The graph input's layout; None: read from its axis of 3 channels.
    layout: Literal["NCHW", "NHWC"] | None = None
    scale: float = Field(default=1 / 255, gt=0)  # 0..255 pixel values times this
    mean: Triple = (0.0, 0.0, 0.0)  # subtracted after scaling, per channel (R, G, B)
    std: Triple = (1.0, 1.0, 1.0)  # then divided by, per channel
    resample: Literal["bilinear", "bicubic", "nearest"] = "bilinear"  # Pillow's resize filter
    # An image whose header claims more pixels is refused before it is decoded.
    max_pixels: int = Field(default=MAX_PIXELS, ge=1)
    max_side: int = Field(default=MAX_SIDE, ge=1)  # nor any whose header claims a longer side
    # Nor any whose longer side / shorter side is past this.
    max_aspect_ratio: float = Field(default=MAX_ASPECT_RATIO, ge=1)
    # Decoding processes; None: one fewer than the cores (at least one), the loop keeps one.
    workers: int | None = Field(default=None, ge=1, le=256)

    def to_metadata(self) -> str:
        """The `ferry.preprocess` entry: the fields that describe the model, not the server."""
        server = {"workers", "max_pixels", "max_side", "max_aspect_ratio"}
        return json.dumps(self.model_dump(exclude=server, exclude_none=True))


@dataclass(frozen=True)
class ImagePlan:
    """The preprocessing of one graph input, every choice made."""

    input: str
    height: int
    width: int
    resize: int
    layout: Literal["NCHW", "NHWC"]
    datatype: str  # the graph input's: FP32, FP16, FP64 or UINT8
    dtype: np.dtype  # its numpy dtype
    scale: np.ndarray  # per channel: scale / std
    shift: np.ndarray  # per channel: -mean / std
    resample: str
    max_pixels: int
    max_side: int
    max_aspect_ratio: float
    workers: int | None


def declared(
    metadata: Mapping[str, str],
    configured: ImagePreprocess | None,
    manifest: Mapping[str, Any] | None = None,
) -> ImagePreprocess | None:
    """The graph's declaration, the model folder's manifest's fields over it, the config's over
    both; None when none declares."""
    raw = metadata.get(METADATA_KEY)
    if raw is None and manifest is None:
        return configured
    try:
        from_graph = json.loads(raw) if raw is not None else {}
    except ValueError as exc:
        raise ValueError(f"the graph's {METADATA_KEY} metadata is not JSON: {exc}") from None
    if not isinstance(from_graph, dict):
        raise ValueError(f"the graph's {METADATA_KEY} metadata is not a JSON object")
    from_config = configured.model_dump(exclude_unset=True) if configured else {}
    try:
        return ImagePreprocess.model_validate({**from_graph, **(manifest or {}), **from_config})
    except ValidationError as exc:
        where = f"the graph's {METADATA_KEY} metadata"
        where += f" with {MANIFEST_NAME}'s preprocess" if manifest is not None else ""
        raise ValueError(f"{where} is not valid: {exc}") from None


def manifest_preprocess(folder: Path) -> dict[str, Any] | None:
    """The preprocessing an image model's folder declares in its manifest, `ferry_model.json`
    of `{"task": "image", "preprocess": {...}}`; None for any other folder or a file."""
    path = folder / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("task") != IMAGE_TASK:
        return None
    preprocess = raw.get("preprocess", {})
    if not isinstance(preprocess, dict):
        raise ValueError(f"{path}: preprocess must be an object of its fields")
    return preprocess


def plan(spec: ImagePreprocess, signature: Signature) -> ImagePlan:
    """`spec` checked against the graph; a ValueError says what does not fit."""
    graph_input = _image_input(spec, signature)
    name, shape = graph_input.name, graph_input.shape
    if graph_input.datatype not in IMAGE_DATATYPES:
        raise ValueError(
            f"preprocess: input {name!r} is {graph_input.datatype}; an image input must be one "
            f"of {list(IMAGE_DATATYPES)}"
        )
    layout = spec.layout or _layout(name, shape)
    channel, rows, columns = (1, 2, 3) if layout == "NCHW" else (3, 1, 2)
    if shape[channel] not in (CHANNELS, _dynamic(shape[channel])):
        raise ValueError(f"preprocess: input {name!r} in {layout} has {shape[channel]} channels")
    height, width = _crop(spec, name, shape[rows], shape[columns])
    resize = spec.resize or max(height, width)
    if resize < max(height, width):
        raise ValueError(
            f"preprocess: resize {resize} is smaller than the crop {height}x{width} "
            "(the shorter side must cover it)"
        )
    if graph_input.datatype == "UINT8" and (
        spec.scale != 1 or any(spec.mean) or spec.std != (1, 1, 1)
    ):
        raise ValueError(
            f"preprocess: input {name!r} takes UINT8 pixels: scale, mean and std "
            "cannot apply (set scale = 1)"
        )
    if any(s == 0 for s in spec.std):
        raise ValueError("preprocess: std must not be 0")
    std = np.array(spec.std, dtype=np.float32)
    return ImagePlan(
        input=name,
        height=height,
        width=width,
        resize=resize,
        layout=layout,
        datatype=graph_input.datatype,
        dtype=graph_input.dtype,
        scale=(spec.scale / std).astype(np.float32),
        shift=(-np.array(spec.mean, dtype=np.float32) / std).astype(np.float32),
        resample=spec.resample,
        max_pixels=spec.max_pixels,
        max_side=spec.max_side,
        max_aspect_ratio=spec.max_aspect_ratio,
        workers=spec.workers,
    )


def _image_input(spec: ImagePreprocess, signature: Signature) -> TensorSpec:
    if spec.input is not None:
        if spec.input not in signature.input_names:
            raise ValueError(
                f"preprocess.input {spec.input!r} is not among the graph's inputs "
                f"{list(signature.input_names)}"
            )
        found = signature.input(spec.input)
    else:
        four = [s for s in signature.inputs if len(s.shape) == 4]
        if len(four) != 1:
            raise ValueError(
                f"preprocess: the graph has {len(four)} 4-D inputs; name the image one "
                "in preprocess.input"
            )
        found = four[0]
    if len(found.shape) != 4:
        raise ValueError(
            f"preprocess: input {found.name!r} has shape "
            f"{found.metadata_shape()}; an image input is 4-D"
        )
    return found


def _dynamic(dim: Any) -> Any:
    """`dim` itself when it is a dynamic axis's name: any size fits it."""
    return dim if isinstance(dim, str) else None


def _layout(name: str, shape: tuple[Any, ...]) -> Literal["NCHW", "NHWC"]:
    first, last = shape[1] == CHANNELS, shape[3] == CHANNELS
    if first != last:
        return "NCHW" if first else "NHWC"
    raise ValueError(
        f"preprocess: cannot tell input {name!r}'s channel axis from its shape "
        f"{[d if isinstance(d, int) else -1 for d in shape]}; set preprocess.layout"
    )


def _crop(spec: ImagePreprocess, name: str, rows: Any, columns: Any) -> tuple[int, int]:
    crop = spec.crop
    if crop is None:
        if not (isinstance(rows, int) and isinstance(columns, int)):
            raise ValueError(
                f"preprocess: input {name!r} has dynamic height or width; set preprocess.crop"
            )
        return rows, columns
    height, width = (crop, crop) if isinstance(crop, int) else crop
    if height < 1 or width < 1:
        raise ValueError(f"preprocess.crop must be positive, got {crop}")
    for axis, want, have in (("height", rows, height), ("width", columns, width)):
        if isinstance(want, int) and want != have:
            raise ValueError(
                f"preprocess.crop {height}x{width} does not fit input {name!r}'s {axis} {want}"
            )
    return height, width
