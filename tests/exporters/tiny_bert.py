"""Tiny random-weight BERTs built in code (nothing downloaded), with the default model's
tokenizer: a user's own 3-input ONNX export of a classifier, and a cross-encoder for rerank."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.exporters.onnx_export import TOKENIZER_FILES

# transformers' export names, and the TensorFlow BERT's names for the same three inputs.
HF_NAMES = ("input_ids", "attention_mask", "token_type_ids")
TF_NAMES = ("input_word_ids", "input_mask", "segment_ids")


@dataclass(frozen=True)
class TinyBert:
    model: Any  # BertForSequenceClassification, in eval mode
    source: Path  # the Hugging Face folder (config, weights, tokenizer)


def build_tiny_bert(
    num_labels: int, tokenizer_dir: Path, source: Path, seed: int = 0, **config: Any
) -> TinyBert:
    """`config`: BertConfig fields over this tiny one's (a classifier's label names)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    tiny = {
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "num_labels": num_labels,
        # 10x transformers' default: scores that differ by text and by segment (at 0.02 every
        # pair scores about the same, and sentence B barely moves it).
        "initializer_range": 0.2,
    }
    model = BertForSequenceClassification(BertConfig(**(tiny | config))).eval()
    model.save_pretrained(source)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, source / name)
    return TinyBert(model, source)


def export_three_inputs(bert: TinyBert, out: Path, names: tuple[str, ...], id_dtype: str) -> Path:
    """What a user's own export looks like: transformers' model traced with all three inputs
    under `names`, ids in `id_dtype`, the HF config and tokenizer beside it, no Ferry manifest."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, id_dtype)
    sample = tuple(torch.ones((2, 8), dtype=dtype) for _ in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _positional(bert.model),
            sample,
            str(out / "model.onnx"),
            input_names=list(names),
            output_names=["logits"],
            dynamic_axes={**axes, "logits": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    for name in ("config.json", *TOKENIZER_FILES):
        if (bert.source / name).exists():
            shutil.copy(bert.source / name, out / name)
    return out


def export_rerank_cli(source: Path, out: Path) -> None:
    """`ferry export onnx --task rerank`, as a user runs it."""
    command = [sys.executable, "-m", "ferry", "export", "onnx", "--task", "rerank"]
    command += ["--model-dir", str(source), "--out", str(out), "--max-length", "128"]
    subprocess.run(command, check=True, capture_output=True)


def _positional(model):
    import torch

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).logits

    return Positional()
