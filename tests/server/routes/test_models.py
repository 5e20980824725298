"""GET /v1/models/{id} through the openai SDK's `models.retrieve`."""

from __future__ import annotations

import openai
import pytest

from ferry.bench.server_process import DEFAULT_MODEL

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(kserve):
    return openai.OpenAI(base_url=f"{kserve.url}/v1", api_key="unused", max_retries=0)


def test_retrieve_a_served_model(client):
    card = client.models.retrieve(DEFAULT_MODEL)
    assert card.id == DEFAULT_MODEL and card.object == "model" and card.owned_by == "ferry"
    assert card.model_dump()["task"] == "embedding"
    assert card in client.models.list().data


def test_retrieve_an_unknown_model_is_404_naming_it(client):
    with pytest.raises(openai.NotFoundError, match="'org/nope' is not served here"):
        client.models.retrieve("org/nope")
