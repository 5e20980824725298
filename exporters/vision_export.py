"""`ferry export vision`: an image classifier in torch to ONNX, its preprocessing in the graph.

The network is the built-in ResNet-18 (exporters/resnet.py; torchvision's module names, so its
state_dicts load) or any `package.module:factory` returning a torch module; weights come from a
local state_dict file, or are random (seeded). The graph takes `pixel_values` [batch, 3, H, W]
FP32 and gives `logits` [batch, classes], the batch axis dynamic; its `ferry.preprocess` metadata
tells `ferry serve` how to decode, resize, crop and normalise a JPEG or PNG for it. The parity
report runs the graph and the torch module on the same random tensors.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ferry.backends.image_spec import METADATA_KEY, ImagePreprocess

OPSET = 17
INPUT, OUTPUT = "pixel_values", "logits"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PARITY_ROWS = 4


@dataclass(frozen=True)
class Parity:
    """The ONNX graph against the torch module on the same tensors."""

    rows: int
    max_abs_diff: float
    top1_agree: int
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.top1_agree == self.rows

    def describe(self) -> str:
        return "\n".join(
            [
                f"parity on {self.rows} random images against torch:",
                f"  max |onnx - torch| = {self.max_abs_diff:.3g} (tolerance {self.tolerance:g})",
                f"  top-1 classes equal: {self.top1_agree}/{self.rows}",
                "  ok" if self.ok else "  NOT OK: the graph does not match the torch module",
            ]
        )


def build(arch: str, num_classes: int, width: int, weights: Path | None, seed: int) -> Any:
    """The module in eval mode: `resnet18`, or `package.module:factory` (called with no
    arguments); a state_dict from `weights`, else random weights from `seed`."""
    import torch

    torch.manual_seed(seed)
    if arch == "resnet18":
        from ferry.exporters.resnet import resnet18

        model = resnet18(num_classes=num_classes, width=width)
    else:
        module, _, name = arch.partition(":")
        if not name:
            raise ValueError(f"--arch {arch!r}: resnet18, or package.module:factory")
        model = getattr(importlib.import_module(module), name)()
    if weights is not None:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state.get("state_dict", state))
    return model.eval()


def preprocess(size: int, resize: int | None) -> ImagePreprocess:
    """ImageNet's: shorter side to `resize` (size / 0.875 unless given), centre crop `size`."""
    return ImagePreprocess(
        input=INPUT,
        resize=resize or round(size / 0.875),
        crop=size,
        layout="NCHW",
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )


def export(model: Any, spec: ImagePreprocess, out: Path) -> Path:
    import onnx
    import torch

    assert isinstance(spec.crop, int), "preprocess() crops square"
    sample = torch.randn(2, 3, spec.crop, spec.crop)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The TorchScript exporter (as exporters/onnx_export.py); its tracer warnings say nothing here.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (sample,),
            str(out),
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    graph = onnx.load(str(out))
    onnx.helper.set_model_props(graph, {METADATA_KEY: spec.to_metadata()})
    onnx.save(graph, str(out))
    return out


def parity(model: Any, graph: Path, size: int, tolerance: float, seed: int) -> Parity:
    import onnxruntime as ort
    import torch

    pixels = np.random.default_rng(seed).standard_normal((PARITY_ROWS, 3, size, size))
    pixels = pixels.astype(np.float32)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    (got,) = session.run([OUTPUT], {INPUT: pixels})
    with torch.no_grad():
        want = model(torch.from_numpy(pixels)).numpy()
    agree = int((got.argmax(1) == want.argmax(1)).sum())
    return Parity(PARITY_ROWS, float(np.abs(got - want).max()), agree, tolerance)
