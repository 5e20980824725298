"""A random 2-layer BERT sequence classifier built in code (nothing downloaded), saved as a
Hugging Face folder with the default model's tokenizer, and its ONNX export."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.exporters.onnx_export import TOKENIZER_FILES, ExportReport, export_encoder


@dataclass(frozen=True)
class TinyClassifier:
    model: Any  # BertForSequenceClassification, in eval mode
    source: Path  # the Hugging Face folder
    exported: Path  # the ONNX export of it
    report: ExportReport


def build_tiny_classifier(
    labels: dict[int, str], tokenizer_dir: Path, source: Path, exported: Path
) -> TinyClassifier:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(source)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, source / name)
    report = export_encoder(source, exported, task="classification", max_length=128)
    return TinyClassifier(model, source, exported, report)
