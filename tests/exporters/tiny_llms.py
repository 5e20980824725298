"""Tiny random-weight sliding-window LLMs built in code (nothing downloaded), as Hugging Face
folders with the committed tiny LLM's tokenizer: Gemma2 (every other layer windowed) and a
Mistral-style model (every layer windowed, no `layer_types` in its config)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.llm.llm_paths import HF_DIR

WINDOW = 16  # tokens; the context is CONTEXT, so prompts longer than the window are easy
CONTEXT = 256
ARCHITECTURES = ("Gemma2ForCausalLM", "MistralForCausalLM")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def build_tiny_sliding(architecture: str, folder: Path) -> Path:
    import torch
    import transformers

    ids = json.loads((HF_DIR / "config.json").read_text())
    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    config = config_class(
        vocab_size=ids["vocab_size"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=WINDOW,
        max_position_embeddings=CONTEXT,
        **{key: ids[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")},
    )
    torch.manual_seed(0)
    getattr(transformers, architecture)(config).save_pretrained(str(folder))
    for name in TOKENIZER_FILES:
        shutil.copy(HF_DIR / name, folder / name)
    return folder
