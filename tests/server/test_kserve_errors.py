"""Errors answered before routing (401, 413, 503) take the shape of the path's protocol."""

from __future__ import annotations

import httpx
import pytest

from ferry.bench.server_process import DEFAULT_MODEL_DIR
from ferry.server.app import create_app
from ferry.server.services import app_services
from ferry.server.settings import Settings

pytestmark = pytest.mark.unit

INFER = "/v2/models/m/infer"


def client_for(**settings: object) -> httpx.AsyncClient:
    # The middleware answers before any route runs, so the app needs no lifespan (no model load).
    models = [{"name": "m", "path": DEFAULT_MODEL_DIR}]
    app = create_app(Settings(models=models, **settings))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ferry")


async def test_unauthorized_is_kserve_shaped_on_v2_and_openai_shaped_elsewhere():
    async with client_for(api_key="k") as client:
        v2 = await client.post(INFER, json={"inputs": []})
        openai = await client.post("/v1/embeddings", json={"model": "m", "input": "x"})
    assert v2.status_code == openai.status_code == 401
    assert v2.json() == {"error": "missing or wrong API key: send 'Authorization: Bearer <key>'"}
    assert openai.json()["error"]["type"] == "authentication_error"


async def test_body_too_large_is_kserve_shaped_on_v2():
    async with client_for(max_body_bytes=1024) as client:
        response = await client.post(INFER, content=b"x" * 2048)
    assert response.status_code == 413
    assert set(response.json()) == {"error"} and "1024-byte limit" in response.json()["error"]


@pytest.mark.parametrize("path", [INFER, "/v2/models/m/ready", "/v2/health/ready"])
async def test_draining_answers_503_with_retry_after_on_v2(path):
    async with client_for() as client:
        app_services(client._transport.app).drain.begin()
        response = await (client.post(path, json={}) if path == INFER else client.get(path))
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    body = response.json()
    assert (
        body == {"ready": False} if path == "/v2/health/ready" else isinstance(body["error"], str)
    )
