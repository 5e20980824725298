"""Cross-encoder routes (/rerank TEI, /v1/rerank Cohere/Jina, /v1/score vLLM) on a tiny random
cross-encoder exported with `ferry export onnx --task rerank`, checked against transformers run
on the same (query, document) pair."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from ferry.bench.server_process import DEFAULT_MODEL, default_model_config, ferry_server
from tests.exporters.tiny_bert import build_tiny_bert, export_rerank_cli
from tests.server.conftest import IN_PROCESS

pytestmark = pytest.mark.integration

QUERY = "when does the ferry leave"
DOCUMENTS = [
    "the ferry leaves at noon from pier four",
    "bananas are rich in potassium",
    "boats to the island run every hour, the first at seven",
    "a ferry",
]
RERANKER = "reranker"
LONG_QUERY = "ferry " * 16_000  # 96k characters: under max_chars_per_text, over any model


@pytest.fixture(scope="module")
def reranker(default_model_dir, tmp_path_factory):
    bert = build_tiny_bert(1, default_model_dir, tmp_path_factory.mktemp("hf"), seed=1)
    out = tmp_path_factory.mktemp("onnx")
    export_rerank_cli(bert.source, out)
    return bert, out


# Pairs, sorting and validation are the API process's; encoder rows over the hop: test_predict.py.
@pytest.fixture(scope="module", params=IN_PROCESS)
def server(request, reranker):
    models = [default_model_config(name=RERANKER, path=str(reranker[1])), default_model_config()]
    with ferry_server(models, server={"api_servers": request.param}) as handle:
        yield handle


@pytest.fixture(scope="module")
def transformers_logit(reranker):
    """What transformers computes for one text or one pair (its own tokenizer and segment
    ids; `flat`: the pair read as one sentence)."""
    import torch
    from transformers import AutoTokenizer

    bert, _ = reranker
    tokenizer = AutoTokenizer.from_pretrained(str(bert.source))

    def run(query: str, document: str | None = None, flat: bool = False) -> float:
        encoded = tokenizer(query, document, return_tensors="pt")
        if flat:
            encoded["token_type_ids"] = torch.zeros_like(encoded["token_type_ids"])
        with torch.no_grad():
            return float(bert.model(**encoded).logits[0, 0])

    return run


@pytest.fixture(scope="module")
def transformers_logits(transformers_logit):
    def run(query: str, documents: list[str]) -> np.ndarray:
        return np.asarray([transformers_logit(query, d) for d in documents])

    return run


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def test_segment_ids_change_the_score(transformers_logit):
    """The checks below mean something: the pair read as one sentence scores differently."""
    pair = transformers_logit(QUERY, DOCUMENTS[0])
    assert abs(transformers_logit(QUERY, DOCUMENTS[0], flat=True) - pair) > 1e-3


@pytest.mark.parametrize("raw", [False, True])
def test_tei_rerank_sorts_by_transformers_score(server, transformers_logits, raw):
    body = {"model": RERANKER, "query": QUERY, "texts": DOCUMENTS, "raw_scores": raw}
    response = post(server, "/rerank", {**body, "return_text": True})
    assert response.status_code == 200, response.text
    want = transformers_logits(QUERY, DOCUMENTS)
    want = want if raw else sigmoid(want)
    ranks = response.json()
    assert [r["index"] for r in ranks] == np.argsort(-want, kind="stable").tolist()
    for rank in ranks:
        assert rank["score"] == pytest.approx(want[rank["index"]], abs=1e-5)
        assert rank["text"] == DOCUMENTS[rank["index"]]
    bare = post(server, "/rerank", body).json()
    assert all("text" not in r for r in bare)


@pytest.mark.parametrize("return_documents", [True, False])
def test_v1_rerank_top_n_and_documents(server, transformers_logits, return_documents):
    response = post(
        server,
        "/v1/rerank",
        {
            "model": RERANKER,
            "query": QUERY,
            "documents": [DOCUMENTS[0], *({"text": d} for d in DOCUMENTS[1:])],
            "top_n": 2,
            "return_documents": return_documents,
        },
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    want = sigmoid(transformers_logits(QUERY, DOCUMENTS))
    best = np.argsort(-want, kind="stable")[:2].tolist()
    assert [r["index"] for r in answer["results"]] == best
    for result in answer["results"]:
        assert result["relevance_score"] == pytest.approx(want[result["index"]], abs=1e-5)
        if return_documents:
            assert result["document"] == {"text": DOCUMENTS[result["index"]]}
        else:
            assert "document" not in result
    assert answer["model"] == RERANKER and answer["usage"]["total_tokens"] > 0


def test_v1_score_pairs_one_with_many_and_one_to_one(
    server, transformers_logit, transformers_logits
):
    one = post(server, "/v1/score", {"model": RERANKER, "text_1": QUERY, "text_2": DOCUMENTS})
    assert one.status_code == 200, one.text
    want = sigmoid(transformers_logits(QUERY, DOCUMENTS))
    data = one.json()["data"]
    assert [d["index"] for d in data] == list(range(len(DOCUMENTS)))  # the request's order
    assert [d["score"] for d in data] == pytest.approx(want.tolist(), abs=1e-5)
    firsts = ["a ferry", "a banana"]
    pairs = post(server, "/score", {"model": RERANKER, "text_1": firsts, "text_2": DOCUMENTS[:2]})
    assert pairs.status_code == 200, pairs.text
    want = [sigmoid(transformers_logit(q, d)) for q, d in zip(firsts, DOCUMENTS[:2], strict=True)]
    assert [d["score"] for d in pairs.json()["data"]] == pytest.approx(want, abs=1e-5)


def test_predict_reports_a_one_logit_head_as_a_score(server, transformers_logit):
    response = post(server, "/predict", {"model": RERANKER, "inputs": QUERY})
    assert response.status_code == 200, response.text
    (item,) = response.json()["outputs"]
    assert set(item) == {"score"}  # not probabilities {"LABEL_0": 1.0}
    assert item["score"] == pytest.approx(sigmoid(transformers_logit(QUERY)), abs=1e-5)
    body = {"model": RERANKER, "inputs": QUERY, "outputs": ["probabilities"]}
    refused = post(server, "/predict", body)
    assert refused.status_code == 422 and refused.json()["error"]["param"] == "outputs"


def test_predict_takes_pairs_with_segment_ids(server, transformers_logit):
    pairs = [[QUERY, d] for d in DOCUMENTS[:2]]
    body = {"model": RERANKER, "inputs": pairs, "outputs": ["score", "logits"]}
    response = post(server, "/predict", body)
    assert response.status_code == 200, response.text
    for (query, document), item in zip(pairs, response.json()["outputs"], strict=True):
        want = transformers_logit(query, document)
        assert item["logits"] == pytest.approx([want], abs=1e-5)
        assert item["score"] == pytest.approx(sigmoid(want), abs=1e-5)


def test_concurrent_reranks_batch_and_each_equals_transformers(server, transformers_logits):
    queries = [f"{QUERY} number {i}" for i in range(12)]

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post("/rerank", json={"model": RERANKER, "query": q, "texts": DOCUMENTS})
                    for q in queries
                )
            )

    for query, response in zip(queries, asyncio.run(send()), strict=True):
        assert response.status_code == 200, response.text
        want = sigmoid(transformers_logits(query, DOCUMENTS))
        for rank in response.json():
            assert rank["score"] == pytest.approx(want[rank["index"]], abs=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/rerank", {"query": " ", "texts": ["a"]}, 422, "query"),
        ("/rerank", {"query": "q", "texts": []}, 422, "texts"),
        ("/rerank", {"query": "q", "texts": ["a", ""]}, 422, "texts[1]"),
        ("/rerank", {"query": "q", "texts": ["a"], "truncation_direction": "Left"}, 422, None),
        ("/rerank", {"query": "q", "texts": ["a"], "raw_scores": "yes"}, 422, "raw_scores"),
        ("/rerank", {"query": "q", "texts": ["a " * 300]}, 422, "texts"),
        ("/rerank", {"query": "q", "texts": ["a"], "model": DEFAULT_MODEL}, 422, "model"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, 400, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["x"]}, 400, None),
        ("/v1/rerank", {"query": "q", "documents": [{"title": "a"}]}, 400, None),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "model": "nope"}, 404, "model"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400, "text_2"),
        ("/v1/score", {"text_1": [], "text_2": ["c"]}, 400, "text_1"),
        ("/v1/score", {"text_1": "a", "text_2": "c", "model": DEFAULT_MODEL}, 400, "model"),
        ("/predict", {"inputs": [["q", "d"], [" ", "d"]]}, 422, "inputs[1]"),
        ("/predict", {"inputs": [["q", "d"], ["q", ""]]}, 422, "inputs[1]"),
        ("/predict", {"inputs": [["q", "d", "e"]]}, 422, None),
        # Issue 48: a query too long for any pair is refused on its own tokens, before a
        # document is tokenized, and named as the route names it.
        ("/rerank", {"query": LONG_QUERY, "texts": ["a"] * 256}, 422, "query"),
        ("/v1/rerank", {"query": LONG_QUERY, "documents": ["a", "b"]}, 400, "query"),
        ("/v1/score", {"text_1": LONG_QUERY, "text_2": ["a", "b"]}, 400, "text_1"),
        ("/v1/score", {"text_1": ["q", LONG_QUERY], "text_2": ["a", "b"]}, 400, "text_1[1]"),
    ],
)
def test_wrong_fields_are_refused_naming_them(server, path, body, status, field):
    response = post(server, path, {"model": RERANKER, **body})
    assert response.status_code == status, response.text
    if field is not None:
        assert response.json()["error"]["param"] == field, response.json()


def test_a_long_query_with_truncate_is_cut_once_and_served(server):
    body = {"model": RERANKER, "query": LONG_QUERY, "texts": DOCUMENTS, "truncate": True}
    response = post(server, "/rerank", body)
    assert response.status_code == 200, response.text
    assert sorted(rank["index"] for rank in response.json()) == list(range(len(DOCUMENTS)))
