"""`ferry export vision`'s arguments and handler (exporters/vision_export.py does the work)."""

from __future__ import annotations

import argparse
from pathlib import Path

# Build (torch's import is most of it), export to ONNX, compare with torch: ResNet-18 at 224 took
# 19.8 s, 10.5 s and 5.9 s on a busy 2-core box.
VISION_WEIGHTS = (3.0, 2.0, 1.0)


def add_vision_command(kinds: argparse._SubParsersAction) -> None:
    vision = kinds.add_parser(
        "vision",
        help="Export an image classifier (ResNet-18, or your torch module) to ONNX, with its "
        "preprocessing and a parity report.",
        description="Writes an ONNX graph (pixel_values [batch, 3, H, W] FP32 -> logits) whose "
        "metadata declares its preprocessing, so `ferry serve --model` decodes JPEG and PNG "
        "for it; compares it with torch on random images and exits 1 when they differ by more "
        "than the tolerance or a top-1 class differs.",
    )
    vision.add_argument(
        "--arch",
        default="resnet18",
        help="resnet18 (built in, torchvision's module names), or package.module:factory "
        "returning a torch module.",
    )
    vision.add_argument(
        "--weights", type=Path, default=None, help="A state_dict file; default: random weights."
    )
    vision.add_argument("--seed", type=int, default=0, help="Seed of the random weights.")
    vision.add_argument(
        "--num-classes", type=int, default=None, help="resnet18's classes (default 1000)."
    )
    vision.add_argument(
        "--width", type=int, default=None, help="resnet18's first stage width (64: the real one)."
    )
    vision.add_argument("--size", type=int, default=224, help="The centre crop, in pixels.")
    vision.add_argument(
        "--resize", type=int, default=None, help="The shorter side before cropping (size/0.875)."
    )
    vision.add_argument("--out", type=Path, required=True, help="The .onnx file to write.")
    vision.add_argument("--tolerance", type=float, default=1e-4, help="Largest difference.")
    vision.set_defaults(handler=_export_vision)


def _export_vision(args: argparse.Namespace) -> int:
    from ferry.exporters import vision_export
    from ferry.exporters.progress import export_progress

    if args.arch != "resnet18" and (args.num_classes or args.width):
        raise SystemExit("ferry export vision: --num-classes and --width are resnet18's only")
    spec = vision_export.preprocess(args.size, args.resize)
    with export_progress("vision", sum(VISION_WEIGHTS)) as progress:
        build, export, compare = VISION_WEIGHTS
        with progress.step(f"building {args.arch}", build):
            model = vision_export.build(
                args.arch, args.num_classes or 1000, args.width or 64, args.weights, args.seed
            )
        with progress.step("exporting to ONNX", export):
            graph = vision_export.export(model, spec, args.out)
        with progress.step("comparing with torch", compare):
            report = vision_export.parity(model, graph, args.size, args.tolerance, args.seed)
    print(f"wrote {graph}")
    print(f"preprocessing: {spec.to_metadata()}")
    print(report.describe())
    return 0 if report.ok else 1
