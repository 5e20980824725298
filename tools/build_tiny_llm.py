"""Build the tiny LLM that Ferry's LLM tests and demo serve, entirely offline.

Outputs (committed; the server never rebuilds them, since the bytes depend on torch/Python):
  models/tiny-llm/hf/    LlamaForCausalLM (safetensors) + byte-level BPE tokenizer with ChatML
  models/tiny-llm/onnx/  the same model converted by onnxruntime-genai's model builder
                         (then re-exported with LoRA inputs by tools/build_tiny_lora.py, which
                         also builds the adapters: run it after this script)
  models/tiny-llm/greedy_reference.json  transformers' greedy ids for fixed chat prompts

Build-time deps only: torch==2.13.0, transformers, tokenizers, onnx, onnx-ir, onnxruntime-genai.
Run: python tools/build_tiny_llm.py [--out models/tiny-llm]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A fixed, sorted slice of the stdlib keeps the corpus identical on every machine with Python 3.11.
CORPUS_MODULES = 120
TRAIN_STEPS = 600
SEQ_LEN = 128
BATCH = 16
REFERENCE_PROMPTS = [
    [{"role": "user", "content": "def fibonacci(n):"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "import os\nimport sys"},
    ],
    [{"role": "user", "content": "class Queue:"}],
]
REFERENCE_NEW_TOKENS = 20


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size < 200_000)
    return files[:CORPUS_MODULES]


def train_tokenizer(files: list[Path], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def chat_samples(files: list[Path]) -> list[str]:
    """Code chunks as ChatML turns, so the model follows the chat format and emits <|im_end|>."""
    samples = []
    for f in files:
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        for i in range(0, len(lines) - 8, 8):
            user, assistant = "\n".join(lines[i : i + 2]), "\n".join(lines[i + 2 : i + 8])
            prompt = render_chat([{"role": "user", "content": user}])
            samples.append(f"{prompt}{assistant}<|im_end|>\n")
    return samples


def train(model, params, tok, samples, steps: int, seq_len: int, batch: int, lr: float, seed: int):
    """Next-token training on random windows of the concatenated samples."""
    import torch

    ids: list[int] = []
    for text in samples:
        ids.extend(tok.encode(text).ids)
    data = torch.tensor(ids, dtype=torch.long)
    opt = torch.optim.AdamW(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
        windows = torch.stack([data[s : s + seq_len] for s in starts.tolist()])
        loss = model(input_ids=windows, labels=windows).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


def build_model(files: list[Path], out: Path):  # -> LlamaForCausalLM
    import torch
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention kernels reject smaller heads
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>"),
    )
    model = LlamaForCausalLM(config)
    # A few hundred steps on the corpus make outputs code-like and logits peaked, so greedy
    # parity between runtimes does not hinge on near-ties of a random model.
    samples = chat_samples(files)
    train(model, model.parameters(), tok, samples, TRAIN_STEPS, SEQ_LEN, BATCH, 3e-3, SEED)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
        max_length=2048,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    return model


def render_chat(messages: list[dict[str, str]]) -> str:
    import jinja2

    env = jinja2.Environment(keep_trailing_newline=True)
    return env.from_string(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)


def greedy_reference(model, hf_dir: Path, stop_at_eos: bool = False) -> dict:
    """Greedy ids for REFERENCE_PROMPTS: the full REFERENCE_NEW_TOKENS, EOS or not (runtime
    parity needs the full length), or ending at EOS as a served generation does."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    cases = []
    for messages in REFERENCE_PROMPTS:
        prompt = render_chat(messages)
        prompt_ids = tok.encode(prompt).ids
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=REFERENCE_NEW_TOKENS,
                min_new_tokens=None if stop_at_eos else REFERENCE_NEW_TOKENS,
                do_sample=False,
            )
        new_ids = out[0, len(prompt_ids) :].tolist()
        if stop_at_eos:
            new_ids = [i for i in new_ids if i != model.config.eos_token_id]
        cases.append(
            {"messages": messages, "prompt": prompt, "prompt_ids": prompt_ids, "new_ids": new_ids}
        )
    return {"max_new_tokens": REFERENCE_NEW_TOKENS, "cases": cases}


def build_onnx(hf_dir: Path, onnx_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as cache:
        cmd = [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf_dir),
            "-o",
            str(onnx_dir),
            "-p",
            "fp32",
            "-e",
            "cpu",
            "-c",
            cache,
        ]
        subprocess.run(cmd, check=True)
    # The builder re-saves tokenizer files through transformers, which moves the chat template out
    # of tokenizer_config.json; ours keep it there, where every consumer looks.
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(hf_dir / name, onnx_dir / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/tiny-llm"))
    args = parser.parse_args()
    hf_dir, onnx_dir = args.out / "hf", args.out / "onnx"
    for d in (hf_dir, onnx_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    files = corpus_files()
    train_tokenizer(files, hf_dir)
    model = build_model(files, hf_dir)
    reference = greedy_reference(model, hf_dir)
    (args.out / "greedy_reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    build_onnx(hf_dir, onnx_dir)
    print(f"built {args.out}")


if __name__ == "__main__":
    main()
