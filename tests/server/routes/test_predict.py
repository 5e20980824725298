"""/predict against a real `ferry serve` process over a real socket, real ONNX Runtime."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

import ferry
from ferry.bench.server_process import default_model_config, ferry_server
from tests.server.conftest import API_SERVERS
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

RNG = np.random.default_rng(7)


def random_ids(length: int) -> list[int]:
    # [CLS] ... [SEP] around ordinary word-piece ids.
    return [101, *RNG.integers(2000, 29000, size=length - 2).tolist(), 102]


@pytest.fixture(scope="module", params=API_SERVERS)
def server(request):
    with ferry_server(
        [default_model_config(batching={"max_queue_delay_s": 0.005})],
        server={"api_servers": request.param},
    ) as handle:
        yield handle


async def post_many(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(*(client.post("/predict", json=b) for b in bodies))


def test_concurrent_mixed_lengths_equal_single_request_inference(server, embed_alone):
    inputs = [random_ids(int(n)) for n in RNG.integers(8, 129, size=64)]
    before = metric_value(server.metrics(), "ferry_batch_size_requests_count")
    responses = asyncio.run(post_many(server.url, [{"input_ids": ids} for ids in inputs]))
    assert [r.status_code for r in responses] == [200] * 64
    for ids, response in zip(inputs, responses, strict=True):
        got = np.asarray(response.json()["outputs"][0]["sentence_embedding"])
        assert np.max(np.abs(got - embed_alone(ids))) <= 1e-5
    text = server.metrics()
    batches = metric_value(text, "ferry_batch_size_requests_count") - before
    assert batches < 64, "requests were never batched together"
    assert metric_value(text, "ferry_batch_size_requests_bucket", le="1.0") < batches


def test_result_is_the_same_batched_with_longer_ones_or_alone(server):
    short = random_ids(10)
    alone = httpx.post(f"{server.url}/predict", json={"input_ids": short}, timeout=30).json()
    together = httpx.post(
        f"{server.url}/predict",
        json={"input_ids": [random_ids(120), short, random_ids(64)]},
        timeout=30,
    ).json()
    a = np.asarray(alone["outputs"][0]["sentence_embedding"])
    b = np.asarray(together["outputs"][1]["sentence_embedding"])
    assert np.max(np.abs(a - b)) <= 1e-5


def test_text_is_tokenized_without_fixed_padding(server):
    body = httpx.post(
        f"{server.url}/predict",
        json={"inputs": ["hello world", "Ferry batches requests."]},
        timeout=30,
    ).json()
    # "hello world" is [CLS] hello world [SEP]: 4 tokens, not the tokenizer file's fixed 128.
    assert body["usage"]["prompt_tokens"] < 20
    embeddings = np.asarray([o["sentence_embedding"] for o in body["outputs"]])
    assert embeddings.shape == (2, 384)
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)


def test_text_and_ids_give_the_same_embedding(server, embed_alone):
    from tokenizers import Tokenizer

    from ferry.bench.server_process import DEFAULT_MODEL_DIR

    tokenizer = Tokenizer.from_file(str(DEFAULT_MODEL_DIR / "tokenizer.json"))
    tokenizer.no_padding()
    ids = tokenizer.encode("the quick brown fox").ids
    body = httpx.post(f"{server.url}/predict", json={"inputs": "the quick brown fox"}).json()
    got = np.asarray(body["outputs"][0]["sentence_embedding"])
    assert np.max(np.abs(got - embed_alone(ids))) <= 1e-5


def test_other_outputs_can_be_requested_and_are_unpadded(server):
    body = httpx.post(
        f"{server.url}/predict",
        json={"input_ids": [random_ids(5), random_ids(9)], "outputs": ["last_hidden_state"]},
        timeout=30,
    ).json()
    assert [len(o["last_hidden_state"]) for o in body["outputs"]] == [5, 9]


BAD_INPUTS = [
    ({"input_ids": [101, 99999, 102]}, 422, "input_ids"),
    ({"input_ids": [101, -1, 102]}, 422, "input_ids"),
    ({"input_ids": [[101, 5, 102]], "attention_mask": [[1, 1]]}, 422, "attention_mask"),
    ({"input_ids": [[101, 5], [101, 6]], "attention_mask": [[1, 1]]}, 422, "attention_mask"),
    ({"input_ids": [101, 5], "attention_mask": [1, 2]}, 422, "attention_mask"),
    ({"input_ids": [101, "x", 102]}, 422, "input_ids[1]"),
    ({"input_ids": [101, 1.5, 102]}, 422, "input_ids[1]"),
    ({"input_ids": [101] * 300}, 422, "input_ids"),
    ({"input_ids": []}, 422, None),
    ({"inputs": ""}, 422, "inputs"),
    ({"inputs": ["ok", "   "]}, 422, "inputs[1]"),
    ({"inputs": 5}, 422, "inputs"),
    ({"inputs": "word " * 400}, 422, "inputs"),
    ({}, 422, None),
    ({"inputs": "a", "input_ids": [1]}, 422, None),
    ({"inputs": "a", "outputs": ["nope"]}, 422, "outputs"),
    ({"inputs": "a", "model": "nope"}, 404, None),
    ({"inputs": "a", "unknown_field": 1}, 422, "unknown_field"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_INPUTS)
def test_bad_input_gets_a_clear_4xx_while_good_requests_in_the_same_window_succeed(
    server, body, status, param
):
    good = [{"input_ids": random_ids(int(n))} for n in RNG.integers(8, 64, size=6)]
    responses = asyncio.run(post_many(server.url, [*good[:3], body, *good[3:]]))
    bad = responses[3]
    assert bad.status_code == status, bad.text
    error = bad.json()["error"]
    assert error["message"] and error["code"] == status
    if param is not None:
        assert error["param"] == param
    assert [r.status_code for i, r in enumerate(responses) if i != 3] == [200] * 6


def test_long_text_is_cut_when_truncation_is_asked_for(server):
    body = httpx.post(
        f"{server.url}/predict", json={"inputs": "word " * 400, "truncate": True}, timeout=30
    ).json()
    assert body["usage"]["prompt_tokens"] == 256


def test_oversized_body_gets_413(server):
    response = httpx.post(
        f"{server.url}/predict",
        content=b'{"inputs": "' + b"a" * (5 * 1024 * 1024) + b'"}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert "limit" in response.json()["error"]["message"]


def test_a_deadline_that_passes_after_admission_gets_504(server):
    row = random_ids(256)
    started = time.perf_counter()
    assert httpx.post(f"{server.url}/predict", json={"input_ids": row}).status_code == 200
    timeout_ms = 1000 * (time.perf_counter() - started)
    # A deadline near one row's round trip that 32 such rows cannot meet. The "cannot be met"
    # floor comes from the cost model, fitted on this shared machine, so it may lie above the
    # round trip just measured: a 422 from it doubles the deadline, which 32 rows still miss.
    for _ in range(4):
        body = {"input_ids": [row] * 32, "timeout_ms": timeout_ms}
        response = httpx.post(f"{server.url}/predict", json=body, timeout=60)
        if response.status_code != 422 or "cannot be met" not in response.text:
            break
        timeout_ms *= 2
    assert response.status_code == 504, response.text
    assert response.json()["error"]["type"] == "timeout_error"
    assert metric_value(server.metrics(), "ferry_rejections_total", reason="deadline") >= 1
    # A deadline already past on arrival is refused before queueing instead.
    body = {"input_ids": random_ids(128), "timeout_ms": 0.001}
    response = httpx.post(f"{server.url}/predict", json=body)
    assert response.status_code == 422 and response.json()["error"]["param"] == "timeout_ms"


def test_models_health_and_docs(server):
    models = httpx.get(f"{server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["all-MiniLM-L6-v2"]
    assert httpx.get(f"{server.url}/health/live").status_code == 200
    assert httpx.get(f"{server.url}/health/ready").json()["status"] == "ready"
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert "/predict" in schema["paths"] and schema["info"]["version"] == ferry.__version__
    assert httpx.get(f"{server.url}/docs").status_code == 200


def test_full_queue_answers_429_with_retry_after_and_loses_nothing():
    config = default_model_config(
        backend={"sessions": 1},
        batching={"max_batch_size": 1, "max_queue_size": 8, "dispatch_when_idle": False},
    )
    with ferry_server([config]) as handle:
        bodies = [{"input_ids": [random_ids(250)] * 4} for _ in range(24)]
        responses = asyncio.run(post_many(handle.url, bodies))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}
        assert 429 in statuses and 200 in statuses
        refused = next(r for r in responses if r.status_code == 429)
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["type"] == "overloaded_error"
        text = handle.metrics()
        assert metric_value(text, "ferry_rejections_total", reason="queue_full") == statuses.count(
            429
        )
        assert metric_value(text, "ferry_queue_depth") == 0
