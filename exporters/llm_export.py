"""GGUF or Hugging Face folder in, onnxruntime-genai model folder out.

A GGUF file is dequantized to a float32 Hugging Face folder by transformers (with the `gguf`
package); onnxruntime-genai's model builder then converts that folder to int4 or fp32 for the CPU.
The builder writes the tokenizer files, the chat template (`chat_template.jinja`) and
genai_config.json (eos/bos/pad ids) from the folder, which is what Ferry's ChatTokenizer and the
engine read; `check_output` makes sure they arrived.

Build-time only: needs the `export` extra (torch, transformers, gguf, onnxruntime-genai).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal

from ferry.exporters.genai_builder import builder_args
from ferry.server.progress import Progress, on_terminal

Precision = Literal["int4", "fp32"]
PRECISIONS: tuple[Precision, ...] = ("int4", "fp32")
Verify = Callable[[Path], None]  # a check of the built folder; raises to fail the export
# The builder says this of an architecture it has no converter for.
_UNSUPPORTED_MARK = "is not currently supported"


# Each step's expected share of an export's time, so that the ETA holds from the first step.
# Rough, not measured as a whole: the builder (a child process importing torch and converting
# every layer) is most of it; dequantizing a small GGUF (with transformers' import) and the
# parity report come next; the checks are seconds.
WEIGHTS = {"dequantize": 2.0, "build": 6.0, "check": 0.5, "verify": 1.5}


def export_weight(gguf: bool, verify: bool) -> float:
    """The total weight of export_llm's steps."""
    weight = WEIGHTS["build"] + WEIGHTS["check"]
    return weight + (WEIGHTS["dequantize"] if gguf else 0) + (WEIGHTS["verify"] if verify else 0)


def _step(progress: Progress | None, what: str, kind: str) -> AbstractContextManager[None]:
    return progress.step(what, WEIGHTS[kind]) if progress is not None else contextlib.nullcontext()


class ExportError(Exception):
    """The model cannot be exported; the message says why and what to do."""


class UnsupportedArchitecture(ExportError):
    pass


def architecture(hf_dir: Path) -> str:
    """The model class named in a Hugging Face folder's config.json."""
    config_path = hf_dir / "config.json"
    if not config_path.exists():
        raise ExportError(f"{hf_dir} has no config.json: not a Hugging Face model folder")
    names = json.loads(config_path.read_text()).get("architectures") or []
    if not names:
        raise UnsupportedArchitecture(
            f"{config_path} names no architecture; onnxruntime-genai's builder dispatches on it"
        )
    return names[0]


@contextlib.contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """transformers parses the file anew for the config, the weights and the tokenizer, and
    gguf-py reads a 49k-entry vocabulary field by field: 8 s each on a small model. One reader
    a path serves all three (its fields are read-only; the tensors are a memory map)."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path: str | Path, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def gguf_to_hf(gguf_file: Path, hf_out: Path) -> Path:
    """Dequantize a GGUF file into a float32 Hugging Face folder (weights, tokenizer, template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    if not on_terminal(sys.stderr):
        # Its per-tensor bars redrawn into a log: Ferry's line for the step says it instead.
        transformers_logging.disable_progress_bar()
    if not gguf_file.is_file():
        raise ExportError(f"{gguf_file} is not a file")
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        with _one_gguf_parse():
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except ValueError as exc:  # transformers: "GGUF model with architecture X is not supported"
        if "not supported" in str(exc):
            message = f"{gguf_file}: transformers cannot read it: {exc}"
            raise UnsupportedArchitecture(message) from exc
        raise
    # The weights are dequantized already; save_pretrained refuses while a GGUF quantizer is set.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    hf_out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(hf_out))
    tokenizer.save_pretrained(str(hf_out))
    return hf_out


def build_genai(
    hf_dir: Path,
    out: Path,
    precision: Precision,
    verify: Verify | None = None,
    progress: Progress | None = None,
) -> Path:
    """onnxruntime-genai's builder on a Hugging Face folder (CPU), in a child process so that
    its memory is freed after; an architecture it cannot convert is an UnsupportedArchitecture.
    `verify` (the parity report) runs on the built folder before it becomes `out`."""
    return build_genai_all([(hf_dir, out)], precision, verify, progress)[0]


def build_genai_all(
    jobs: Sequence[tuple[Path, Path]],
    precision: Precision,
    verify: Verify | None = None,
    progress: Progress | None = None,
) -> list[Path]:
    """`build_genai` on each (Hugging Face folder, out) with one builder process: its imports are
    most of a small model's export time. One failure fails them all and leaves no `out`."""
    if precision not in PRECISIONS:
        raise ExportError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    archs = [architecture(hf_dir) for hf_dir, _ in jobs]
    # Built beside `out` and moved in once checked: a failed or interrupted export leaves no
    # folder that looks complete (`make model` tests for genai_config.json).
    partials = [out.with_name(out.name + ".partial") for _, out in jobs]
    for partial in partials:
        shutil.rmtree(partial, ignore_errors=True)
    try:
        with _step(progress, f"onnxruntime-genai's builder ({precision})", "build"):
            _run_builder([hf_dir for hf_dir, _ in jobs], partials, precision, archs)
        for (hf_dir, _), partial, arch in zip(jobs, partials, archs, strict=True):
            with _step(progress, "checking it runs as Ferry serves it", "check"):
                check_output(partial)
                check_attention_windows(partial, hf_dir, arch)
                smoke_run(partial, arch)
            if verify is not None:
                with _step(progress, "greedy parity against transformers", "verify"):
                    verify(partial)
    except BaseException:
        for partial in partials:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    for (_, out), partial in zip(jobs, partials, strict=True):
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
    return [out for _, out in jobs]


def _run_builder(
    hf_dirs: list[Path], partials: list[Path], precision: Precision, archs: list[str]
) -> None:
    options = [
        # Full-length KV caches on every layer, the window applied by the attention kernel:
        # what Ferry's batched lane holds (llm/sliding_window.py).
        "windowed_kv_cache=false",
        # k-quant picks each block's scales to minimise the error; the default round-to-nearest
        # changed SmolLM2's answers ("boiling point ... 101.03"), at the same int4 speed.
        *(("algo_config=k_quant",) if precision == "int4" else ()),
    ]
    with tempfile.TemporaryDirectory() as scratch:
        jobs = []
        for index, (hf_dir, partial) in enumerate(zip(hf_dirs, partials, strict=True)):
            work = Path(scratch) / str(index)
            source = _with_sliding_layers(hf_dir, work / "hf")
            jobs.append(builder_args(source, partial, precision, work / "cache", options))
        jobs_file, results_file = Path(scratch) / "jobs.json", Path(scratch) / "results.json"
        jobs_file.write_text(json.dumps(jobs))
        cmd = [sys.executable, "-m", "ferry.exporters.genai_builder"]
        done = subprocess.run([*cmd, str(jobs_file), str(results_file)], capture_output=True)
        if done.returncode != 0:  # the process died: no job's result to name
            log = (done.stderr + done.stdout).decode(errors="replace")
            raise ExportError(f"onnxruntime-genai's builder failed on {hf_dirs}:\n{log[-3000:]}")
        failures = json.loads(results_file.read_text())
    for hf_dir, arch, log in zip(hf_dirs, archs, failures, strict=True):
        if log is None:
            continue
        if _UNSUPPORTED_MARK in log:
            raise UnsupportedArchitecture(
                f"onnxruntime-genai's builder cannot convert {arch} ({hf_dir}); see "
                "`python -m onnxruntime_genai.models.builder --help` for the architectures it "
                'supports, or serve the Hugging Face folder with engine = "vllm" on a GPU host'
            )
        raise ExportError(f"onnxruntime-genai's builder failed on {hf_dir}:\n{log[-3000:]}")


def _sliding_windows(hf_dir: Path) -> tuple[int, list[int]] | None:
    """(context, each layer's window or -1) as transformers applies them; None without a window
    shorter than the context."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(hf_dir))
    except (OSError, ValueError) as exc:  # the builder reads it the same way
        raise ExportError(f"transformers cannot read {hf_dir}/config.json: {exc}") from exc
    window = getattr(config, "sliding_window", None)
    context = getattr(config, "max_position_embeddings", None)
    if not window or window <= 0 or (context is not None and window >= context):
        return None
    layers = config.num_hidden_layers
    # No layer_types (Mistral, Phi3, Mixtral...): transformers windows every layer.
    kinds = getattr(config, "layer_types", None) or ["sliding_attention"] * layers
    return context, [window if kind == "sliding_attention" else -1 for kind in kinds[:layers]]


def _with_sliding_layers(hf_dir: Path, view: Path) -> Path:
    """The folder the builder reads: `hf_dir`, or a view of it whose config names the sliding
    layers, since the builder windows only layers that `layer_types` marks."""
    config = json.loads((hf_dir / "config.json").read_text())
    windows = _sliding_windows(hf_dir)
    if windows is None or config.get("layer_types"):
        return hf_dir
    view.mkdir(parents=True)
    for item in hf_dir.iterdir():
        if item.name != "config.json":
            (view / item.name).symlink_to(item.resolve())
    layer_types = ["sliding_attention" if w > 0 else "full_attention" for w in windows[1]]
    (view / "config.json").write_text(json.dumps({**config, "layer_types": layer_types}))
    return view


def check_attention_windows(out: Path, hf_dir: Path, arch: str) -> None:
    """Each layer's attention in the export has the sliding window transformers gives it."""
    import onnx

    from ferry.llm.errors import UnservableModel
    from ferry.llm.sliding_window import check_sliding_window

    try:
        check_sliding_window(json.loads((out / "genai_config.json").read_text()))
    except UnservableModel as exc:
        raise UnsupportedArchitecture(str(exc)) from exc
    windows = _sliding_windows(hf_dir)
    if windows is None:
        return
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    actual = [
        next((a.i for a in node.attribute if a.name == "local_window_size"), -1)
        for node in graph.node
        if node.op_type == "GroupQueryAttention"
    ]
    context, expected = windows
    if actual != expected:
        raise UnsupportedArchitecture(
            f"{arch}: transformers gives its layers sliding windows {expected} (shorter than its "
            f"{context}-token context), but onnxruntime-genai's builder gave the export's "
            f"attention {actual or 'no GroupQueryAttention'}: prompts longer than the window "
            "would give wrong text"
        )


def smoke_run(out: Path, arch: str) -> None:
    """A prompt and a decode step the way the server runs them: a model that cannot serve a
    request fails its export, not every request after the server says it is ready."""
    import numpy as np

    from ferry.llm.ortgenai_kv import KVModel

    try:
        model = KVModel(out, intra_op_threads=1)
        block = model.new_block(1, 4)
        token = int(model.prefill(block, 0, 0, [0, 1, 2]).argmax())
        model.decode(block, 1, np.array([3]), np.array([token]))
    except Exception as exc:
        raise ExportError(f"the {arch} export does not run as Ferry serves it: {exc}") from exc


def check_output(out: Path) -> None:
    """What serving reads is there: the tokenizer, a chat template and the stop token."""
    from ferry.llm.chat_tokenizer import ChatTokenizer

    genai = json.loads((out / "genai_config.json").read_text())
    if genai["model"].get("eos_token_id") is None:
        raise ExportError(f"{out}/genai_config.json has no eos_token_id: generations never stop")
    try:
        ChatTokenizer(out)
    except (OSError, ValueError) as exc:
        message = f"{out}: the tokenizer or chat template did not carry over: {exc}"
        raise ExportError(message) from exc


def export_llm(
    out: Path,
    precision: Precision,
    *,
    gguf: Path | None = None,
    hf: Path | None = None,
    hf_out: Path | None = None,
    verify: Verify | None = None,
    progress: Progress | None = None,
) -> Path:
    """Export from exactly one of `gguf` or `hf`; a GGUF's float32 folder goes to `hf_out`
    (kept: the parity report and LoRA training read it), or next to `out` when not given.
    `progress` (of total `export_weight(...)`) is told as each step ends."""
    if (gguf is None) == (hf is None):
        raise ExportError("give exactly one of a GGUF file or a Hugging Face folder")
    if gguf is not None:
        with _step(progress, f"dequantizing {gguf.name} to float32", "dequantize"):
            hf = gguf_to_hf(gguf, hf_out or out.with_name(out.name + "-hf"))
    assert hf is not None
    return build_genai(hf, out, precision, verify, progress)
