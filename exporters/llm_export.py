"""GGUF or Hugging Face folder in, onnxruntime-genai model folder out.

A GGUF file is dequantized to a float32 Hugging Face folder by transformers (with the `gguf`
package); onnxruntime-genai's model builder then converts that folder to int4 or fp32 for the CPU.
The builder writes the tokenizer files, the chat template (`chat_template.jinja`) and
genai_config.json (eos/bos/pad ids) from the folder, which is what Ferry's ChatTokenizer and the
engine read; `check_output` makes sure they arrived.

Build-time only: needs the `export` extra (torch, transformers, gguf, onnxruntime-genai).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal

Precision = Literal["int4", "fp32"]
PRECISIONS: tuple[Precision, ...] = ("int4", "fp32")
# The builder says this of an architecture it has no converter for.
_UNSUPPORTED_MARK = "is not currently supported"


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


def gguf_to_hf(gguf_file: Path, hf_out: Path) -> Path:
    """Dequantize a GGUF file into a float32 Hugging Face folder (weights, tokenizer, template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not gguf_file.is_file():
        raise ExportError(f"{gguf_file} is not a file")
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
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


def build_genai(hf_dir: Path, out: Path, precision: Precision) -> Path:
    """onnxruntime-genai's builder on a Hugging Face folder (CPU), in a child process so that
    its memory is freed after; an architecture it cannot convert is an UnsupportedArchitecture."""
    if precision not in PRECISIONS:
        raise ExportError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    arch = architecture(hf_dir)
    # Built beside `out` and moved in once checked: an interrupted export leaves no folder that
    # looks complete (`make model` tests for genai_config.json).
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tempfile.TemporaryDirectory() as cache:
        cmd = [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            *("-i", str(hf_dir), "-o", str(partial), "-p", precision, "-e", "cpu", "-c", cache),
            # k-quant picks each block's scales to minimise the error; the default round-to-nearest
            # changed SmolLM2's answers ("boiling point ... 101.03"), at the same int4 speed.
            *(("--extra_options", "algo_config=k_quant") if precision == "int4" else ()),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        log = done.stderr + done.stdout
        if _UNSUPPORTED_MARK in log:
            raise UnsupportedArchitecture(
                f"onnxruntime-genai's builder cannot convert {arch} ({hf_dir}); see "
                "`python -m onnxruntime_genai.models.builder --help` for the architectures it "
                'supports, or serve the Hugging Face folder with engine = "vllm" on a GPU host'
            )
        raise ExportError(f"onnxruntime-genai's builder failed on {hf_dir}:\n{log[-3000:]}")
    check_output(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


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
) -> Path:
    """Export from exactly one of `gguf` or `hf`; a GGUF's float32 folder goes to `hf_out`
    (kept: the parity report and LoRA training read it), or next to `out` when not given."""
    if (gguf is None) == (hf is None):
        raise ExportError("give exactly one of a GGUF file or a Hugging Face folder")
    if gguf is not None:
        hf = gguf_to_hf(gguf, hf_out or out.with_name(out.name + "-hf"))
    assert hf is not None
    return build_genai(hf, out, precision)
