"""Hugging Face encoder folder -> ONNX with dynamic batch and sequence axes.

The graph takes int64 `input_ids` and `attention_mask`; token_type_ids are zeros built inside
the graph, so clients and the batcher never have to send them. Embedding models also get an
L2-normalised mean-pooled `sentence_embedding` computed in the graph (sentence-transformers'
pooling), classification models output `logits`. A cross-encoder (`rerank`: one logit) also takes
`token_type_ids`: it reads a (query, document) pair, and the segment ids change its score.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ferry.backends.manifest import ModelManifest, Task

OPSET = 17
INPUT_NAMES = ["input_ids", "attention_mask"]
PAIR_INPUT_NAMES = [*INPUT_NAMES, "token_type_ids"]
DYNAMIC_AXES = {
    "input_ids": {0: "batch", 1: "sequence"},
    "attention_mask": {0: "batch", 1: "sequence"},
    "token_type_ids": {0: "batch", 1: "sequence"},
    "last_hidden_state": {0: "batch", 1: "sequence"},
    "sentence_embedding": {0: "batch"},
    "logits": {0: "batch"},
}
# BERT-style models have 512 positions; the default model was trained on 256-token inputs.
DEFAULT_MAX_LENGTH = 256
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


@dataclass(frozen=True)
class ExportReport:
    onnx_path: Path
    max_abs_diff: float


def export_encoder(
    model_dir: Path,
    out_dir: Path,
    task: Task = "embedding",
    max_length: int = DEFAULT_MAX_LENGTH,
) -> ExportReport:
    """Export `model_dir` to `out_dir` (model.onnx, tokenizer files, manifest); check parity."""
    import torch  # build-time dependency, imported here so the package imports without it

    out_dir.mkdir(parents=True, exist_ok=True)
    wrapper = _build_wrapper(model_dir, task)
    output_names = (
        ["last_hidden_state", "sentence_embedding"] if task == "embedding" else ["logits"]
    )
    input_names = input_names_for(task)
    sample = _sample_inputs(wrapper.vocab_size)
    onnx_path = out_dir / "model.onnx"
    # The legacy TorchScript exporter is chosen on purpose (stable graphs for BERT-style encoders);
    # its deprecation and tracer warnings say nothing about this export.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            tuple(torch.from_numpy(sample[name]) for name in input_names),
            str(onnx_path),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes={name: DYNAMIC_AXES[name] for name in input_names + output_names},
            opset_version=OPSET,
            dynamo=False,
        )
    for name in TOKENIZER_FILES:
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out_dir / name)
    ModelManifest(
        task=task,
        max_length=min(max_length, wrapper.max_positions),
        vocab_size=wrapper.vocab_size,
        pad_token_id=wrapper.pad_token_id,
        id2label=wrapper.id2label,
        source=str(model_dir),
    ).write(out_dir)
    return ExportReport(onnx_path, max_abs_diff=parity_max_abs_diff(wrapper, onnx_path))


def input_names_for(task: Task) -> list[str]:
    return PAIR_INPUT_NAMES if task == "rerank" else INPUT_NAMES


def parity_max_abs_diff(wrapper, onnx_path: Path, seed: int = 0) -> float:
    """Largest absolute difference between PyTorch and ONNX Runtime over a few padded batches."""
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    worst = 0.0
    for batch, length in [(1, 5), (3, 17), (4, 64)]:
        sample = _sample_inputs(wrapper.vocab_size, batch, length, rng)
        inputs = {name: sample[name] for name in input_names_for(wrapper.task)}
        with torch.no_grad():
            expected = wrapper(*(torch.from_numpy(value) for value in inputs.values()))
        actual = session.run(None, inputs)
        for want, got in zip(expected, actual, strict=True):
            worst = max(worst, float(np.max(np.abs(want.numpy() - got))))
    return worst


def _sample_inputs(
    vocab_size: int, batch: int = 2, length: int = 8, rng: np.random.Generator | None = None
) -> dict[str, np.ndarray]:
    rng = rng or np.random.default_rng(0)
    ids = rng.integers(1000 if vocab_size > 2000 else 1, vocab_size, size=(batch, length))
    mask = np.ones((batch, length), dtype=np.int64)
    # Ragged rows, so the exported graph is traced with real padding.
    for row in range(1, batch):
        mask[row, length - row :] = 0
    # A pair's second segment: the last half of each row's real tokens.
    types = ((np.arange(length) >= length // 2)[None] * mask).astype(np.int64)
    return {
        "input_ids": ids.astype(np.int64) * mask,
        "attention_mask": mask,
        "token_type_ids": types,
    }


def _build_wrapper(model_dir: Path, task: Task):
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    loader = AutoModel if task == "embedding" else AutoModelForSequenceClassification
    # Eager attention traces into plain ops that every ONNX Runtime build supports.
    model = loader.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    if task == "rerank" and model.config.num_labels != 1:
        raise ValueError(
            f"{model_dir}: a rerank model (a cross-encoder) has one logit; this one has "
            f"{model.config.num_labels} labels (export it with --task classification)"
        )

    class EncoderWrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.task = task
            config = model.config
            self.vocab_size = int(config.vocab_size)
            self.max_positions = int(config.max_position_embeddings)
            self.pad_token_id = int(config.pad_token_id or 0)
            self.id2label = (
                {int(k): str(v) for k, v in config.id2label.items()} if task != "embedding" else {}
            )

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            if task != "embedding":
                return (out.logits,)
            hidden = out.last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            embedding = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return hidden, embedding

    return EncoderWrapper().eval()
