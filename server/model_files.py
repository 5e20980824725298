"""What a model's path holds: a token encoder's folder (Ferry's export, or a Hugging Face one:
a tokenizer and config.json beside the graph) or a plain ONNX graph.

Decided by the files, so `ferry serve --model resnet18.onnx` needs no manifest; a path that is
not there is an error naming it.
"""

from __future__ import annotations

from pathlib import Path

from ferry.backends.hf_folder import folder_manifest
from ferry.backends.image_spec import manifest_preprocess
from ferry.backends.manifest import MANIFEST_NAME, ModelManifest
from ferry.server.settings import ModelSettings
from ferry.server.tokenization import TextTokenizer

GRAPH_NAME = "model.onnx"
# What transformers and optimum write beside a token model's graph.
HF_TOKEN_MODEL = ("tokenizer.json", "config.json")


def plain_graph(settings: ModelSettings) -> Path | None:
    """The ONNX file to serve as plain tensors; None for a token encoder's folder (a manifest, or
    Hugging Face's tokenizer.json and config.json) or a backend that reads a folder of its own
    (torch, triton), which image preprocessing cannot apply to: refused rather than ignored."""
    graph = _plain_graph(settings)
    if graph is None and settings.preprocess is not None:
        raise ValueError(
            f"model {settings.name!r}: preprocess applies to a plain ONNX graph on the "
            f"onnxruntime backend, not to {settings.path} on {settings.backend.kind}"
        )
    return graph


def _plain_graph(settings: ModelSettings) -> Path | None:
    path = settings.path
    if not path.exists():
        raise FileNotFoundError(f"model {settings.name!r}: no such file or folder: {path}")
    if settings.backend.kind != "onnxruntime":
        return None
    if path.is_file():
        return path
    encoder = (path / MANIFEST_NAME).exists() and manifest_preprocess(path) is None
    if encoder or all((path / f).exists() for f in HF_TOKEN_MODEL):
        return None
    if (path / GRAPH_NAME).exists():
        return path / GRAPH_NAME
    graphs = sorted(path.glob("*.onnx"))
    if len(graphs) != 1:
        found = "no .onnx file" if not graphs else f"{len(graphs)} .onnx files and no model.onnx"
        raise FileNotFoundError(
            f"model {settings.name!r}: {path} has no {MANIFEST_NAME} and {found}"
        )
    return graphs[0]


def token_model_files(settings: ModelSettings) -> tuple[ModelManifest, TextTokenizer]:
    """A token encoder's manifest and tokenizer, read alike where the model runs and in an API
    process. The manifest: ferry_model.json, else what a Hugging Face config.json beside the
    model says (a folder served by `torch`, or an optimum export); the error names the files."""
    manifest = folder_manifest(settings.path)
    return manifest, TextTokenizer(settings.path / "tokenizer.json", manifest.max_length)
