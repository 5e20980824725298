"""KServe v2 on Ferry, driven by tritonclient.http exactly as it would drive Triton."""

from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.server_process import DEFAULT_MODEL, default_model_config, ferry_server

RNG = np.random.default_rng(5)


@pytest.fixture(scope="module")
def server():
    with ferry_server([default_model_config(max_queue_delay_ms=5)]) as handle:
        yield handle


@pytest.fixture
def client(server):
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    yield client
    client.close()


def padded_batch(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = [101, *RNG.integers(2000, 29000, size=n - 2), 102]
        mask[row, :n] = 1
    return ids, mask


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
    metadata = client.get_model_metadata(DEFAULT_MODEL)
    assert [i["name"] for i in metadata["inputs"]] == ["input_ids", "attention_mask"]
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
    assert info.value.status() == "422"

    unknown = httpx.post(f"{server.url}/v2/models/nope/infer", json={"inputs": []}, timeout=10)
    assert unknown.status_code == 404
    assert set(unknown.json()) == {"error"} and "nope" in unknown.json()["error"]

    garbled = httpx.post(f"{server.url}/v2/models/{DEFAULT_MODEL}/infer", content=b"{", timeout=10)
    assert garbled.status_code == 400 and "JSON" in garbled.json()["error"]

    too_long = np.ones((1, 300), dtype=np.int64)
    with pytest.raises(InferenceServerException, match="at most 256") as info:
        infer(client, too_long, too_long)
    assert info.value.status() == "422"
