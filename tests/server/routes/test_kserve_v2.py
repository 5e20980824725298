"""KServe v2 on Ferry, driven by tritonclient.http exactly as it would drive Triton."""

from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import ferry
from ferry.bench.server_process import DEFAULT_MODEL
from tests.server.kserve_support import RNG, padded_batch
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(kserve):
    return kserve


@pytest.fixture
def client(server):
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    client.close()


def infer(client, ids, mask, outputs=("sentence_embedding",), binary=True):
    inputs = []
    for name, value in (("input_ids", ids), ("attention_mask", mask)):
        tensor = triton_http.InferInput(name, list(value.shape), "INT64")
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    wanted = [triton_http.InferRequestedOutput(n, binary_data=binary) for n in outputs]
    return client.infer(DEFAULT_MODEL, inputs, outputs=wanted)


def test_health_and_model_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(DEFAULT_MODEL)
    assert client.get_server_metadata()["version"] == ferry.__version__
    metadata = client.get_model_metadata(DEFAULT_MODEL)
    assert {i["name"]: i["datatype"] for i in metadata["inputs"]} == {
        "input_ids": "INT64",
        "attention_mask": "INT64",
        "text": "BYTES",
    }
    assert {o["name"] for o in metadata["outputs"]} == {"last_hidden_state", "sentence_embedding"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_padded_rows_equal_each_row_run_alone(client, embed_alone, binary):
    ids, mask = padded_batch([9, 30, 4])
    result = infer(client, ids, mask, binary=binary)
    embeddings = result.as_numpy("sentence_embedding")
    assert embeddings.dtype == np.float32 and embeddings.shape == (3, 384)
    for row in range(3):
        alone = embed_alone(ids[row, : int(mask[row].sum())].tolist())
        assert np.max(np.abs(embeddings[row] - alone)) <= 1e-5


def test_sequence_output_is_padded_back_to_the_request_width(client):
    ids, mask = padded_batch([5, 12])
    hidden = infer(client, ids, mask, outputs=("last_hidden_state",)).as_numpy("last_hidden_state")
    assert hidden.shape == (2, 12, 384)
    assert not hidden[0, 5:].any()


def test_concurrent_clients_share_batches(server, embed_alone):
    def one(n: int) -> tuple[np.ndarray, np.ndarray]:
        client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            ids, mask = padded_batch([n])
            return ids, infer(client, ids, mask).as_numpy("sentence_embedding")
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, RNG.integers(5, 60, size=16).tolist()))
    for ids, embedding in results:
        assert np.max(np.abs(embedding[0] - embed_alone(ids[0].tolist()))) <= 1e-5


def test_errors_use_the_kserve_shape(server, client):
    ids, mask = padded_batch([4])
    with pytest.raises(InferenceServerException, match="differs from input_ids") as info:
        infer(client, ids, mask[:, :2])
    assert info.value.status() == "400"

    unknown = httpx.post(f"{server.url}/v2/models/nope/infer", json={"inputs": []}, timeout=10)
    assert unknown.status_code == 404
    assert set(unknown.json()) == {"error"} and "nope" in unknown.json()["error"]

    garbled = httpx.post(f"{server.url}/v2/models/{DEFAULT_MODEL}/infer", content=b"{", timeout=10)
    assert garbled.status_code == 400 and "JSON" in garbled.json()["error"]

    too_long = np.ones((1, 300), dtype=np.int64)
    with pytest.raises(InferenceServerException, match="at most 256") as info:
        infer(client, too_long, too_long)
    assert info.value.status() == "400"


def text_input(texts: list[str], binary: bool) -> triton_http.InferInput:
    tensor = triton_http.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object), binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_text_input_is_tokenized_by_the_server(server, client, binary):
    texts = ["a short sentence", "a second, somewhat longer sentence about ferries"]
    result = client.infer(DEFAULT_MODEL, [text_input(texts, binary)])
    embeddings = result.as_numpy("sentence_embedding")
    predicted = httpx.post(f"{server.url}/predict", json={"inputs": texts}, timeout=30).json()
    expected = np.array([o["sentence_embedding"] for o in predicted["outputs"]])
    assert embeddings.shape == (2, 384)
    assert np.max(np.abs(embeddings - expected)) <= 1e-5


def test_text_errors_name_the_item(client):
    with pytest.raises(
        InferenceServerException, match=r"text\[1\]: text must not be empty"
    ) as info:
        client.infer(DEFAULT_MODEL, [text_input(["fine", " "], binary=True)])
    assert info.value.status() == "400"
    ids, _ = padded_batch([4])
    both = [
        text_input(["fine"], binary=False),
        triton_http.InferInput("input_ids", [1, 4], "INT64"),
    ]
    both[1].set_data_from_numpy(ids)
    with pytest.raises(InferenceServerException, match="either text or input_ids"):
        client.infer(DEFAULT_MODEL, both)


def test_model_config_is_the_model_limits(client):
    config = client.get_model_config(DEFAULT_MODEL)
    assert config["name"] == DEFAULT_MODEL
    assert config["max_batch_size"] == 32  # the model's max_batch_size setting
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 1024
    assert {i["name"]: i["data_type"] for i in config["input"]} == {
        "input_ids": "TYPE_INT64",
        "attention_mask": "TYPE_INT64",
        "text": "TYPE_STRING",
    }
    assert {o["name"] for o in config["output"]} == {"last_hidden_state", "sentence_embedding"}
    assert config["parameters"]["max_sequence_length"]["string_value"] == "256"
    # sessions = 2 in the test config: two batches run at once, on the CPU here
    assert config["instance_group"] == [{"name": DEFAULT_MODEL, "kind": "KIND_CPU", "count": 2}]


def test_statistics_are_the_metrics_numbers(server, client):
    ids, mask = padded_batch([6, 9])
    infer(client, ids, mask)
    stats = client.get_inference_statistics(DEFAULT_MODEL)["model_stats"]
    text = server.metrics()
    assert [s["name"] for s in stats] == [DEFAULT_MODEL]
    inference = stats[0]["inference_stats"]
    queued = metric_value(text, "ferry_queue_wait_seconds_count", model=DEFAULT_MODEL)
    batches = metric_value(text, "ferry_backend_inference_seconds_count", model=DEFAULT_MODEL)
    assert queued >= 2 and inference["queue"]["count"] == queued
    assert batches >= 1 and stats[0]["execution_count"] == batches
    assert inference["compute_infer"]["count"] == batches
    answered = metric_value(text, "ferry_requests_total", model=DEFAULT_MODEL)
    assert inference["success"]["count"] + inference["fail"]["count"] == answered
    assert inference["success"]["ns"] > 0 and inference["queue"]["ns"] > 0
    every = client.get_inference_statistics()["model_stats"]
    assert [s["name"] for s in every] == [DEFAULT_MODEL]


def test_every_v2_error_has_the_kserve_shape(server):
    for response in (
        httpx.get(f"{server.url}/v2/models/nope/config", timeout=10),
        httpx.get(f"{server.url}/v2/models/nope/stats", timeout=10),
        httpx.get(f"{server.url}/v2/no/such/route", timeout=10),
        httpx.delete(f"{server.url}/v2/models/{DEFAULT_MODEL}/infer", timeout=10),
    ):
        assert response.status_code in (404, 405)
        assert set(response.json()) == {"error"} and isinstance(response.json()["error"], str)
