"""The torch backend on the CPU: same outputs as the ONNX export, served by `ferry serve` as is."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from ferry.backends.hf_folder import folder_manifest
from ferry.backends.manifest import ModelManifest
from ferry.backends.onnxruntime import OnnxRuntimeBackend
from ferry.backends.placement import DeviceUnavailable
from ferry.backends.torch_backend import TorchBackend
from ferry.backends.torch_graphs import CudaGraphs, bucket
from ferry.batcher import TokenSequence, pad_batch
from ferry.bench.server_process import ferry_server
from ferry.exporters.default_model import default_model_source
from ferry.server.tokenization import TextTokenizer
from tests.exporters.tiny_classifier import build_tiny_classifier

pytestmark = pytest.mark.integration

LABELS = {0: "negative", 1: "positive"}
# Mixed lengths, so the batch carries real padding.
IDS = [[101, 7592, 2088, 2003, 1037, 3899, 102], [101, 2023, 102], [101, *range(2000, 2040), 102]]


def batch_members(ids: list[list[int]]) -> list[TokenSequence]:
    return [TokenSequence.from_ids(i) for i in ids]


def padded(ids: list[list[int]]):
    return pad_batch(batch_members(ids))


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    return default_model_source()


async def test_embeddings_match_the_onnx_backend_on_a_padded_batch(hf_dir, default_model_dir):
    torch_backend = TorchBackend(hf_dir, device="cpu")
    onnx_backend = OnnxRuntimeBackend(default_model_dir / "model.onnx", sessions=1)
    await torch_backend.start()
    await onnx_backend.start()
    try:
        assert torch_backend.output_names == onnx_backend.output_names
        assert torch_backend.sequence_outputs == onnx_backend.sequence_outputs
        assert (torch_backend.device, torch_backend.dtype_name) == ("cpu", "float32")
        batch = padded(IDS)
        got = await torch_backend.infer(batch)
        want = await onnx_backend.infer(batch)
        assert got["sentence_embedding"].dtype == np.float32
        assert np.max(np.abs(got["sentence_embedding"] - want["sentence_embedding"])) <= 1e-5
        for row, length in enumerate(batch.lengths):  # padded positions are garbage in both
            diff = got["last_hidden_state"][row, :length] - want["last_hidden_state"][row, :length]
            assert np.max(np.abs(diff)) <= 1e-4
        assert np.allclose(np.linalg.norm(got["sentence_embedding"], axis=1), 1.0, atol=1e-6)
        # A batch that asks for the embedding alone gets it alone (the hidden states stay on
        # the device), and the same values.
        alone = await torch_backend.infer(
            pad_batch(batch_members(IDS), outputs=("sentence_embedding",))
        )
        assert list(alone) == ["sentence_embedding"]
        assert np.array_equal(alone["sentence_embedding"], got["sentence_embedding"])
    finally:
        await torch_backend.close()
        await onnx_backend.close()


async def test_a_batch_padded_to_its_cuda_graph_bucket_answers_as_itself(hf_dir):
    """The bucketed path CUDA graphs replay (torch_graphs.py), run eagerly on the CPU: the extra
    rows and positions are masked away, and the outputs cut back to the batch's own."""
    import torch

    backend = TorchBackend(hf_dir, device="cpu")
    await backend.start()
    try:
        graphs = CudaGraphs(
            backend._all_outputs, "cpu", None, max_rows=4, max_length=64, capture=False
        )
        batch = padded(IDS)  # 3 rows of up to 42 tokens: the 4 x 64 bucket
        types = np.zeros_like(batch.input_ids)
        # First a fuller batch of the same bucket: its tokens must not linger in the reused
        # host buffers.
        full = padded([[101, *range(3000, 3060), 102]] * 4)
        assert graphs.run(full.input_ids, full.attention_mask, np.ones_like(full.input_ids))
        bucketed = graphs.run(batch.input_ids, batch.attention_mask, types)
        assert bucketed is not None
        with torch.inference_mode():
            plain = backend._all_outputs(
                *(torch.from_numpy(a) for a in (batch.input_ids, batch.attention_mask, types))
            )
        for name, want in plain.items():
            assert bucketed[name].shape == want.shape, name
        got, want = bucketed["sentence_embedding"], plain["sentence_embedding"]
        assert torch.max(torch.abs(got - want)) <= 1e-5
        for row, length in enumerate(batch.lengths):
            diff = (
                bucketed["last_hidden_state"][row, :length]
                - plain["last_hidden_state"][row, :length]
            )
            assert torch.max(torch.abs(diff)) <= 1e-4
        # Past the largest bucket: no graph, the backend runs it eagerly.
        wide = padded([[101, *range(2000, 2100), 102]])
        assert (
            graphs.run(wide.input_ids, wide.attention_mask, np.zeros_like(wide.input_ids)) is None
        )
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("rows", "length", "want"),
    [
        (1, 1, (1, 16)),
        (3, 17, (4, 32)),
        (8, 512, (8, 512)),
        (9, 16, (16, 16)),
        (129, 8, None),
        (1, 513, None),
    ],
)
def test_cuda_graph_buckets(rows, length, want):
    assert bucket(rows, length, max_rows=128, max_length=512) == want


@pytest.mark.parametrize(
    ("options", "refusal"),
    [({"device": "cpu"}, 'device = "cpu"'), ({"compile": True}, "choose one")],
)
def test_cuda_graphs_where_they_cannot_run_are_refused(options, refusal):
    from pydantic import ValidationError

    from ferry.backends.options import TorchOptions

    with pytest.raises(ValidationError, match=refusal):
        TorchOptions(kind="torch", cuda_graphs=True, **options)


def test_manifest_of_the_hf_folder_is_the_exports(hf_dir, default_model_dir):
    derived = folder_manifest(hf_dir)
    exported = ModelManifest.read(default_model_dir)
    assert (derived.task, derived.max_length, derived.vocab_size, derived.pad_token_id) == (
        exported.task,
        exported.max_length,
        exported.vocab_size,
        exported.pad_token_id,
    )


async def test_cuda_required_runs_on_the_gpu_or_refuses_unless_fallback_allowed(hf_dir):
    """On a CPU-only torch a model meant for the GPU refuses to start, or falls back when allowed;
    where torch sees a GPU the same settings run there (the choice itself: test_placement)."""
    import torch

    gpu = torch.cuda.is_available()
    if not gpu:
        with pytest.raises(DeviceUnavailable, match="allow_cpu_fallback"):
            await TorchBackend(hf_dir, device="cuda").start()
    backend = TorchBackend(hf_dir, device="cuda", allow_cpu_fallback=True)
    await backend.start()
    try:
        assert backend.device == ("cuda" if gpu else "cpu")
        assert (await backend.infer(padded(IDS[:1])))["sentence_embedding"].shape == (1, 384)
    finally:
        await backend.close()


@pytest.fixture(scope="module")
def tiny_classifier(hf_dir, tmp_path_factory) -> tuple[Path, Path]:
    """A random 2-layer BERT classifier as a Hugging Face folder, and its ONNX export."""
    built = build_tiny_classifier(
        LABELS, hf_dir, tmp_path_factory.mktemp("hf-classifier"), tmp_path_factory.mktemp("onnx")
    )
    return built.source, built.exported


async def test_classifier_logits_match_the_onnx_export(tiny_classifier):
    source, exported = tiny_classifier
    manifest = folder_manifest(source)
    assert (manifest.task, manifest.id2label, manifest.max_length) == (
        "classification",
        LABELS,
        128,
    )
    torch_backend = TorchBackend(source, task="classification", device="cpu")
    onnx_backend = OnnxRuntimeBackend(exported / "model.onnx", sessions=1)
    await torch_backend.start()
    await onnx_backend.start()
    try:
        assert torch_backend.output_names == onnx_backend.output_names == ("logits",)
        batch = padded(IDS)
        got, want = await torch_backend.infer(batch), await onnx_backend.infer(batch)
        assert got["logits"].shape == (3, 2)
        assert np.max(np.abs(got["logits"] - want["logits"])) <= 1e-5
    finally:
        await torch_backend.close()
        await onnx_backend.close()


def test_ferry_serves_the_hf_folder_with_the_onnx_paths_outputs(
    hf_dir, tiny_classifier, embed_alone
):
    texts = ["the ferry leaves at noon", "a boat"]
    models = [
        {"name": "st", "path": str(hf_dir), "backend": {"kind": "torch", "device": "cpu"}},
        {
            "name": "cls",
            "path": str(tiny_classifier[0]),
            "backend": {"kind": "torch", "device": "cpu"},
            "outputs": ["label"],
        },
    ]
    with ferry_server(models, ready_timeout_s=180) as server:
        embedded = httpx.post(f"{server.url}/predict", json={"model": "st", "inputs": texts})
        classified = httpx.post(
            f"{server.url}/predict",
            json={"model": "cls", "inputs": texts, "outputs": ["label", "probabilities"]},
        )
    assert embedded.status_code == 200, embedded.text
    tokenizer = TextTokenizer(hf_dir / "tokenizer.json", 256)
    for text, output in zip(texts, embedded.json()["outputs"], strict=True):
        want = embed_alone(tokenizer.encode([text]).input_ids[0].tolist())
        assert np.max(np.abs(np.asarray(output["sentence_embedding"]) - want)) <= 1e-5
    assert classified.status_code == 200, classified.text
    for output in classified.json()["outputs"]:
        assert output["label"] in LABELS.values()
        assert set(output["probabilities"]) == set(LABELS.values())
        assert output["label"] == max(output["probabilities"], key=output["probabilities"].get)
