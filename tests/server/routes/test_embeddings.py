"""/v1/embeddings through the real `openai` SDK against a running Ferry."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from ferry.bench.server_process import DEFAULT_MODEL, ferry_server
from tests.server.conftest import IN_PROCESS

pytestmark = pytest.mark.integration

TEXTS = ["Ferry serves embeddings.", "A second, somewhat longer sentence to embed."]


# The SDK's shapes and validation, in the API process; encoder rows over the hop: test_predict.py.
@pytest.fixture(scope="module", params=IN_PROCESS)
def server(request):
    with ferry_server(server={"api_servers": request.param}) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def predict(server, body: dict) -> np.ndarray:
    outputs = httpx.post(f"{server.url}/predict", json=body, timeout=30).json()["outputs"]
    return np.asarray([o["sentence_embedding"] for o in outputs])


def test_sdk_embeddings_equal_predict(server, client):
    # The SDK asks for base64 by default and decodes it itself.
    result = client.embeddings.create(model=DEFAULT_MODEL, input=TEXTS)
    got = np.asarray([d.embedding for d in result.data])
    assert np.max(np.abs(got - predict(server, {"inputs": TEXTS}))) <= 1e-6
    assert [d.index for d in result.data] == [0, 1]
    assert result.usage.prompt_tokens == result.usage.total_tokens > 0


def test_float_format_and_token_arrays(server, client):
    ids = [[101, 7592, 2088, 102], [101, 2023, 102]]
    result = client.embeddings.create(model=DEFAULT_MODEL, input=ids, encoding_format="float")
    got = np.asarray([d.embedding for d in result.data])
    assert np.max(np.abs(got - predict(server, {"input_ids": ids}))) <= 1e-6
    assert result.usage.prompt_tokens == 7


def test_unknown_model_is_404_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model="nope", input="x")
    assert info.value.body["type"] == "not_found_error"


def test_invalid_input_is_400_naming_the_field(client):
    # Named as this route's clients know it, never as another route's `input_ids`/`inputs`.
    for bad, param in (
        ([[101, 999999, 102]], "input"),
        ([[101, 102], [101, -1, 102]], "input[1]"),
        (["fine", " "], "input[1]"),
        ("", "input"),
        ([], "input"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model=DEFAULT_MODEL, input=bad)
        assert info.value.body["param"] == param, bad
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=DEFAULT_MODEL, input="x", dimensions=3)
