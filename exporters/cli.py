"""`ferry export ...`: the exporter subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_export_commands(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser(
        "export", help="Build servable artifacts from Hugging Face / PyTorch models."
    )
    kinds = export.add_subparsers(dest="export_kind", required=True, metavar="KIND")

    default = kinds.add_parser(
        "default", help="Export the embedded default model (all-MiniLM-L6-v2) to ONNX."
    )
    default.add_argument("--out", type=Path, required=True, help="Folder to write the model to.")
    default.set_defaults(handler=_export_default)

    onnx = kinds.add_parser(
        "onnx", help="Export a local Hugging Face encoder folder to ONNX with dynamic axes."
    )
    onnx.add_argument("--model-dir", type=Path, required=True, help="Hugging Face model folder.")
    onnx.add_argument("--out", type=Path, required=True, help="Folder to write the model to.")
    onnx.add_argument(
        "--task",
        choices=["embedding", "classification"],
        default="embedding",
        help="embedding: mean-pooled, L2-normalised sentence_embedding; "
        "classification: logits, served as label + probabilities.",
    )
    onnx.add_argument(
        "--max-length", type=int, default=256, help="Longest input the server will accept."
    )
    onnx.set_defaults(handler=_export_onnx)


def _report(report) -> int:
    print(f"wrote {report.onnx_path} (parity vs PyTorch: max abs diff {report.max_abs_diff:.2e})")
    return 0


def _export_default(args: argparse.Namespace) -> int:
    from exporters.default_model import export_default_model

    return _report(export_default_model(args.out))


def _export_onnx(args: argparse.Namespace) -> int:
    from exporters.onnx_export import export_encoder

    return _report(export_encoder(args.model_dir, args.out, args.task, args.max_length))
