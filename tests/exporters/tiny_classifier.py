"""A random 2-layer BERT sequence classifier built in code (nothing downloaded), saved as a
Hugging Face folder with the default model's tokenizer (tiny_bert.py), and its ONNX export."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.exporters.onnx_export import ExportReport, export_encoder
from tests.exporters.tiny_bert import build_tiny_bert


@dataclass(frozen=True)
class TinyClassifier:
    model: Any  # BertForSequenceClassification, in eval mode
    source: Path  # the Hugging Face folder
    exported: Path  # the ONNX export of it
    report: ExportReport


def build_tiny_classifier(
    labels: dict[int, str], tokenizer_dir: Path, source: Path, exported: Path
) -> TinyClassifier:
    bert = build_tiny_bert(
        len(labels),
        tokenizer_dir,
        source,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        initializer_range=0.02,  # transformers' default: logits near zero, a soft softmax
    )
    report = export_encoder(source, exported, task="classification", max_length=128)
    return TinyClassifier(bert.model, source, exported, report)
