"""Sequence classification end to end: a tiny random BERT made here, exported, served by Ferry."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from ferry.bench.server_process import default_model_config, ferry_server
from tests.exporters.tiny_classifier import build_tiny_classifier

pytestmark = pytest.mark.integration

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = ["what a wonderful ferry ride", "the boat was late again", "it sailed at noon"]


@pytest.fixture(scope="module")
def tiny_classifier(default_model_dir, tmp_path_factory):
    """Random weights, config in code, the default model's tokenizer: nothing downloaded."""
    built = build_tiny_classifier(
        LABELS, default_model_dir, tmp_path_factory.mktemp("hf"), tmp_path_factory.mktemp("onnx")
    )
    return built.model, built.exported, built.report


def torch_probabilities(model, model_dir, text: str) -> np.ndarray:
    import torch
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    ids = torch.tensor([tokenizer.encode(text).ids])
    with torch.no_grad():
        logits = model(input_ids=ids, token_type_ids=torch.zeros_like(ids)).logits[0]
    return torch.softmax(logits.double(), dim=-1).numpy()


def test_export_matches_pytorch(tiny_classifier):
    assert tiny_classifier[2].max_abs_diff <= 1e-5


@pytest.fixture(scope="module")
def server(tiny_classifier):
    _, out, _ = tiny_classifier
    config = default_model_config(name="clf", path=str(out), outputs=["label", "probabilities"])
    with ferry_server([config]) as handle:
        yield handle


def test_predict_returns_label_and_softmax_of_pytorch_logits(tiny_classifier, server):
    model, out, _ = tiny_classifier
    response = httpx.post(f"{server.url}/predict", json={"inputs": TEXTS}, timeout=30)
    assert response.status_code == 200, response.text
    for text, item in zip(TEXTS, response.json()["outputs"], strict=True):
        want = torch_probabilities(model, out, text)
        got = np.array([item["probabilities"][LABELS[i]] for i in range(len(LABELS))])
        assert np.max(np.abs(got - want)) <= 1e-5
        assert item["label"] == LABELS[int(np.argmax(want))]


def test_kserve_top_classes_are_named_by_id2label(tiny_classifier, server):
    """Triton's classification extension on the logits: "value:index:label", best first."""
    model, out, _ = tiny_classifier
    texts = httpclient.InferInput("text", [len(TEXTS), 1], "BYTES")
    texts.set_data_from_numpy(np.array([[t.encode()] for t in TEXTS], dtype=object))
    wanted = [httpclient.InferRequestedOutput("logits", class_count=2)]
    with httpclient.InferenceServerClient(server.url.removeprefix("http://")) as client:
        result = client.infer("clf", [texts], outputs=wanted).as_numpy("logits")
    assert result.shape == (len(TEXTS), 2)
    for text, row in zip(TEXTS, result, strict=True):
        best = np.argsort(-torch_probabilities(model, out, text))[:2]  # softmax keeps the order
        got = [item.decode().split(":") for item in row]
        assert [(int(index), label) for _, index, label in got] == [
            (int(i), LABELS[int(i)]) for i in best
        ]
