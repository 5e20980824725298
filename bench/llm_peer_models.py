"""The models bench.llm_peer serves, each as Ferry's int4 folder and llama.cpp's Q4_0 GGUF.

- smollm2: the default chat model (`make model`'s artifacts/models), and a Q4_0 GGUF converted
  from the same float32 folder Ferry's export was made from (artifacts/hf).
- qwen05b: Qwen2.5-0.5B's shapes (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate
  4864, tied embeddings) with random weights (seed fixed) and SmolLM2's tokenizer (vocabulary
  49,152): a 0.5B-class decoder that downloads nothing. Ferry's folder comes from
  `ferry export llm --hf` (the exporter's defaults), llama's from the same float32 folder.

Q4_0 because llama.cpp repacks Q4_0 weights into its fastest x86 kernels (the load log's
CPU_REPACK buffer) and not Q4_1, and it is the format closest to Ferry's int4. `--pure` keeps
every tensor Q4_0, the tied embedding (llama's output matmul) too, as Ferry's export has its tied
embedding and lm_head in int4. Without it llama-quantize makes that tensor Q8_0 (Q6_K needs rows
of 256), which stays unrepacked: the 0.5B's repack buffer is 192 MiB then (issue 38's run),
216 MiB with --pure. The GGUF goes through llama.cpp's own convert_hf_to_gguf.py (f16) and
llama-quantize, from the llama-cpp-python sdist tools/build_llama_server.sh builds. Everything
built lands in a cache folder and is reused.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ferry.bench.server_process import DEFAULT_LLM, DEFAULT_LLM_DIR, DEFAULT_LLM_HF_DIR, REPO

LLAMA_DIR = REPO / ".venv-llama"
LLAMA_SERVER = LLAMA_DIR / "bin" / "llama-server"
LLAMA_QUANTIZE = LLAMA_DIR / "bin" / "llama-quantize"
DEFAULT_CACHE = REPO / "artifacts" / "bench-cache"
QWEN05B = "qwen05b-random"
# Qwen2.5-0.5B's config.json, its vocabulary aside (SmolLM2's tokenizer instead).
QWEN05B_SHAPES = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


# convert_hf_to_gguf.py, run from llama.cpp's sources (argv: sources, then the script's own).
# Its BPE path (Qwen2's) names the pre-tokenizer by a hash of the tokenizer's output, and the
# SmolLM2 tokenizer transformers re-saved from the GGUF hashes to none it knows: both models
# here use that tokenizer, and llama.cpp's name for it is "smollm". (The bench sends token ids;
# llama-server only detokenizes.)
_CONVERT = """
import runpy, sys
sources = sys.argv.pop(1)
sys.path[0:0] = [sources, sources + "/gguf-py"]
from conversion.base import TextModel
known = TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "smollm"
TextModel.get_vocab_base_pre = pre
sys.argv[0] = sources + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass(frozen=True)
class PeerModel:
    name: str  # the name Ferry serves it under
    ferry_dir: Path  # onnxruntime-genai int4 folder
    gguf: Path | None  # llama.cpp Q4_0; None: llama-server is not run (not built)


def llama_sources() -> Path:
    """llama.cpp's tree inside the unpacked sdist (convert_hf_to_gguf.py and its gguf-py)."""
    found = sorted(LLAMA_DIR.glob("src/llama_cpp_python-*/vendor/llama.cpp"))
    if not found:
        raise FileNotFoundError(f"no llama.cpp sources in {LLAMA_DIR}/src: run build_llama_server")
    return found[-1]


def q4_0_gguf(hf_dir: Path, out: Path) -> Path:
    """`hf_dir` -> f16 GGUF (convert_hf_to_gguf.py) -> Q4_0 (llama-quantize --pure)."""
    if out.is_file():
        return out
    if not LLAMA_QUANTIZE.is_file():
        raise FileNotFoundError(f"{LLAMA_QUANTIZE} missing: run tools/build_llama_server.sh")
    f16 = out.with_suffix(".f16.gguf")
    if not f16.is_file():
        command = [sys.executable, "-c", _CONVERT, str(llama_sources()), str(hf_dir)]
        command += ["--outtype", "f16", "--outfile", str(f16)]
        subprocess.run(command, check=True, capture_output=True)
    partial = out.with_suffix(".partial")
    quantize = [str(LLAMA_QUANTIZE), "--pure", str(f16), str(partial), "Q4_0"]
    subprocess.run(quantize, check=True, capture_output=True)
    partial.rename(out)
    f16.unlink()
    return out


def random_qwen05b(out: Path) -> Path:
    """A float32 Hugging Face folder: Qwen2ForCausalLM with QWEN05B_SHAPES, random weights
    (seed 0), SmolLM2's tokenizer, chat template and special token ids."""
    if (out / "config.json").is_file():
        return out
    import json

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    source = json.loads((DEFAULT_LLM_HF_DIR / "config.json").read_text())
    ids = {k: source[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = Qwen2Config(vocab_size=source["vocab_size"], **QWEN05B_SHAPES, **ids)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    for name in _TOKENIZER_FILES:
        shutil.copy(DEFAULT_LLM_HF_DIR / name, partial / name)
    partial.rename(out)
    return out


def ferry_export(hf_dir: Path, out: Path) -> Path:
    """`ferry export llm --hf` int4, as a user exports their own model."""
    if (out / "genai_config.json").is_file():
        return out
    command = [sys.executable, "-m", "ferry", "export", "llm", "--hf", str(hf_dir)]
    command += ["--out", str(out), "--precision", "int4", "--parity-tokens", "0"]
    subprocess.run(command, check=True)
    return out


def peer_models(
    names: list[str], cache: Path, smollm2_dir: Path = DEFAULT_LLM_DIR, *, gguf: bool = True
) -> list[PeerModel]:
    """The requested models, built into `cache` where missing; `gguf` False: Ferry's only."""
    cache.mkdir(parents=True, exist_ok=True)
    models = []
    if "smollm2" in names:
        path = cache / f"{DEFAULT_LLM}.Q4_0.gguf"
        built = q4_0_gguf(DEFAULT_LLM_HF_DIR, path) if gguf else None
        models.append(PeerModel(DEFAULT_LLM, smollm2_dir, built))
    if "qwen05b" in names:
        hf_dir = random_qwen05b(cache / f"{QWEN05B}-hf")
        ferry_dir = ferry_export(hf_dir, cache / f"{QWEN05B}-int4")
        path = cache / f"{QWEN05B}.Q4_0.gguf"
        models.append(PeerModel(QWEN05B, ferry_dir, q4_0_gguf(hf_dir, path) if gguf else None))
    return models
