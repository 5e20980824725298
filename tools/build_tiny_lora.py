"""Build the tiny LoRA adapters for the committed tiny Llama, entirely offline.

Run after tools/build_tiny_llm.py: python tools/build_tiny_lora.py [--model models/tiny-llm]

Outputs (committed; the server never builds them):
  <model>/adapters/<name>/hf/                  peft adapter (adapter_config.json + safetensors):
                                               what vLLM's LoRARequest and transformers load
  <model>/adapters/<name>/<name>.onnx_adapter  the same weights in onnxruntime's adapter format
  <model>/onnx/                                the base model re-exported with its LoRA weights
                                               as inputs (zeros by default: greedy output is the
                                               base model's, tests/llm/test_tiny_model.py checks)
  <model>/adapters/greedy_reference.json       transformers + peft greedy ids per adapter

onnxruntime-genai applies an adapter by binding its tensors to the model inputs of the same
names, so the base must be exported with those inputs: the model builder's `adapter_path` bakes
a LoRA branch in as initializers; they are turned into graph inputs that keep an initializer as
their default (ONNX's overridable initializers), with zeros so that no adapter means the base.

Build-time deps only: the `export` extra (torch, transformers, peft, onnx, onnxruntime-genai).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from build_tiny_llm import (
    corpus_files,
    greedy_reference,
    render_chat,
    train,
)

SEED = 4321
RANK = 8
TARGETS = ["q_proj", "v_proj"]
STEPS = 80
SEQ_LEN = 64
BATCH = 8
LR = 1e-2
LORA_MARKERS = ("lora_A", "lora_B")


def zen_samples() -> list[str]:
    """Every reply is the Zen of Python, whatever the prompt."""
    import this  # prints the Zen once; its rot13 source is decoded below

    zen = "".join(this.d.get(c, c) for c in this.s).splitlines()[2:]
    samples = []
    for i, line in enumerate(zen):
        prompt = render_chat([{"role": "user", "content": f"rule {i}"}])
        samples.append(f"{prompt}{line}\n{zen[(i + 1) % len(zen)]}<|im_end|>\n")
    return samples


def shout_samples() -> list[str]:
    """Code prompts answered with the following lines in upper case."""
    samples = []
    for f in corpus_files()[:20]:
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        for i in range(0, min(len(lines) - 4, 200), 4):
            prompt = render_chat([{"role": "user", "content": lines[i]}])
            samples.append(f"{prompt}{chr(10).join(lines[i + 1 : i + 4]).upper()}<|im_end|>\n")
    return samples


ADAPTERS = {"zen": zen_samples, "shout": shout_samples}


def train_adapter(hf_dir: Path, samples: list[str], out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    base = LlamaForCausalLM.from_pretrained(str(hf_dir))
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS, lora_dropout=0.0)
    model = get_peft_model(base, config)
    trainable = [p for p in model.parameters() if p.requires_grad]
    train(model, trainable, tok, samples, STEPS, SEQ_LEN, BATCH, LR, SEED)
    model.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)  # peft's blank model card


def build_with_adapter(hf_dir: Path, adapter_dir: Path, out: Path) -> None:
    """onnxruntime-genai's model builder, with the LoRA branch baked in as initializers."""
    with tempfile.TemporaryDirectory() as cache:
        cmd = [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            *("-i", str(hf_dir), "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", cache),
            *("--extra_options", f"adapter_path={adapter_dir}"),
        ]
        subprocess.run(cmd, check=True)


def lora_weights(onnx_dir: Path) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_dir / "model.onnx"))
    return {
        init.name: numpy_helper.to_array(init)
        for init in model.graph.initializer
        if any(marker in init.name for marker in LORA_MARKERS)
    }


def make_lora_inputs(onnx_dir: Path) -> list[str]:
    """Turn the LoRA initializers into graph inputs with zero defaults; returns their names."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(onnx_dir / "model.onnx"))
    names = []
    for init in model.graph.initializer:
        if not any(marker in init.name for marker in LORA_MARKERS):
            continue
        zeros = np.zeros_like(numpy_helper.to_array(init))
        init.CopyFrom(numpy_helper.from_array(zeros, init.name))
        # The rank is the dynamic axis, as onnxruntime-genai's LoRA exports declare it.
        rank_axis = 1 if "lora_A" in init.name else 0
        dims = ["lora_rank" if i == rank_axis else d for i, d in enumerate(zeros.shape)]
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, dims))
        names.append(init.name)
    (onnx_dir / "model.onnx.data").unlink()  # onnx appends to an existing data file
    onnx.save(
        model,
        str(onnx_dir / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
    )
    return names


def write_onnx_adapter(weights: dict[str, np.ndarray], path: Path) -> None:
    import onnxruntime as ort

    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in weights.items()})
    adapter.export_adapter(str(path))


def peft_reference(hf_dir: Path, peft_dir: Path) -> dict:
    """Plain greedy ids of the saved adapter through transformers + peft, ending at <|im_end|>
    as a served generation does (the base reference forces 20 tokens instead)."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    model = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(str(hf_dir)), peft_dir)
    model.eval()
    return greedy_reference(model, hf_dir, stop_at_eos=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/tiny-llm"))
    parser.add_argument(
        "--reference-only", action="store_true", help="only redo the reference of saved adapters"
    )
    args = parser.parse_args()
    hf_dir, adapters_dir, lora_dir = args.model / "hf", args.model / "adapters", args.model / "onnx"
    if not args.reference_only:
        build(hf_dir, adapters_dir, lora_dir)
    references = {name: peft_reference(hf_dir, adapters_dir / name / "hf") for name in ADAPTERS}
    (adapters_dir / "greedy_reference.json").write_text(json.dumps(references, indent=1) + "\n")


def build(hf_dir: Path, adapters_dir: Path, lora_dir: Path) -> None:
    shutil.rmtree(adapters_dir, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, samples in ADAPTERS.items():
            peft_dir = adapters_dir / name / "hf"
            train_adapter(hf_dir, samples(), peft_dir)
            built = Path(tmp) / name
            build_with_adapter(hf_dir, peft_dir, built)
            write_onnx_adapter(lora_weights(built), adapters_dir / name / f"{name}.onnx_adapter")
        # Every adapter has the same LoRA input names: any build serves as the base.
        shutil.rmtree(lora_dir, ignore_errors=True)
        shutil.copytree(Path(tmp) / next(iter(ADAPTERS)), lora_dir)
    names = make_lora_inputs(lora_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(hf_dir / name, lora_dir / name)
    print(f"built {len(ADAPTERS)} adapters over {len(names)} LoRA inputs in {adapters_dir}")


if __name__ == "__main__":
    main()
