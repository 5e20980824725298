"""Tiny random-weight LLMs of each architecture the README lists as exportable, built in code
(nothing downloaded), as Hugging Face folders with the committed tiny LLM's tokenizer and a chat
template with tools of the family's own format (tests/llm/chat_templates)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.llm.llm_paths import HF_DIR

WINDOW = 16  # tokens; the context is CONTEXT, so prompts longer than the window are easy
CONTEXT = 1024
TEMPLATES = Path(__file__).resolve().parents[1] / "llm" / "chat_templates"
TOKENIZER_FILES = ("tokenizer.json", "special_tokens_map.json")


@dataclass(frozen=True)
class TinyLLM:
    name: str
    architecture: str
    template: str  # a file in TEMPLATES
    config: dict[str, Any] = field(default_factory=dict)  # on top of the shared tiny shapes

    @property
    def chat_template(self) -> str:
        return (TEMPLATES / self.template).read_text()


MATRIX = {
    spec.name: spec
    for spec in (
        TinyLLM("llama", "LlamaForCausalLM", "llama3.1_json.jinja"),
        TinyLLM("qwen2", "Qwen2ForCausalLM", "qwen2.5.jinja"),
        TinyLLM("qwen3", "Qwen3ForCausalLM", "qwen2.5.jinja"),
        # Phi-3-mini-4k's shape: no long-context RoPE factors, which the builder reads otherwise.
        TinyLLM(
            "phi3", "Phi3ForCausalLM", "phi3.jinja", {"original_max_position_embeddings": CONTEXT}
        ),
        TinyLLM("mistral", "MistralForCausalLM", "mistral.jinja", {"sliding_window": None}),
        # Every layer windowed, no `layer_types` in its config.
        TinyLLM(
            "mistral-window", "MistralForCausalLM", "mistral.jinja", {"sliding_window": WINDOW}
        ),
        TinyLLM("gemma", "GemmaForCausalLM", "gemma.jinja"),
        # Every other layer windowed.
        TinyLLM("gemma2", "Gemma2ForCausalLM", "gemma.jinja", {"sliding_window": WINDOW}),
    )
}
SLIDING = ("gemma2", "mistral-window")


def build_tiny_llm(spec: TinyLLM, folder: Path) -> Path:
    import torch
    import transformers

    ids = json.loads((HF_DIR / "config.json").read_text())
    config_class = getattr(transformers, spec.architecture.replace("ForCausalLM", "Config"))
    shapes: dict[str, Any] = {
        "vocab_size": ids["vocab_size"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "max_position_embeddings": CONTEXT,
        **{key: ids[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")},
    }
    config = config_class(**{**shapes, **spec.config})
    torch.manual_seed(0)
    getattr(transformers, spec.architecture)(config).save_pretrained(str(folder))
    for name in TOKENIZER_FILES:
        shutil.copy(HF_DIR / name, folder / name)
    tokenizer_config = json.loads((HF_DIR / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = spec.chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return folder
