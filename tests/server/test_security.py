"""API key, CORS and request limits, against a running server."""

from __future__ import annotations

import httpx
import pytest

from ferry.bench.server_process import ferry_server

pytestmark = pytest.mark.integration

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server():
    with ferry_server(
        server={
            "max_items_per_request": 4,
            "max_tokens_per_request": 300,
            "cors_allow_origins": ["https://app.example"],
        },
        env={"FERRY_API_KEY": KEY},
    ) as handle:
        yield handle


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_inference_needs_the_key(server):
    body = {"inputs": "hello"}
    missing = httpx.post(f"{server.url}/predict", json=body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["type"] == "authentication_error"
    assert httpx.post(f"{server.url}/predict", json=body, headers=auth("wrong")).status_code == 401
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.post(f"{server.url}/predict", json=body, headers=auth()).status_code == 200


def test_health_and_metrics_stay_open_by_default(server):
    assert httpx.get(f"{server.url}/health/ready").status_code == 200
    assert httpx.get(f"{server.url}/health/live").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200


def test_health_and_metrics_can_be_protected_too():
    settings = {"api_key_protects_health": True, "api_key_protects_metrics": True}
    with ferry_server(server=settings, env={"FERRY_API_KEY": KEY}) as handle:
        assert httpx.get(f"{handle.url}/metrics").status_code == 401
        assert httpx.get(f"{handle.url}/metrics", headers=auth()).status_code == 200
        assert httpx.get(f"{handle.url}/health/live").status_code == 401


def test_cors_only_for_configured_origins(server):
    preflight = {"Access-Control-Request-Method": "POST"}
    allowed = httpx.options(
        f"{server.url}/predict", headers={"Origin": "https://app.example", **preflight}
    )
    assert allowed.headers.get("access-control-allow-origin") == "https://app.example"
    other = httpx.options(
        f"{server.url}/predict", headers={"Origin": "https://evil.example", **preflight}
    )
    assert "access-control-allow-origin" not in other.headers


def test_items_per_request_are_limited(server):
    response = httpx.post(
        f"{server.url}/predict", json={"inputs": ["a", "b", "c", "d", "e"]}, headers=auth()
    )
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "inputs"


def test_no_field_can_name_a_file(server):
    # The model is chosen by its configured name only; a path is just an unknown name.
    response = httpx.post(
        f"{server.url}/predict", json={"inputs": "x", "model": "/etc/passwd"}, headers=auth()
    )
    assert response.status_code == 404


def test_tokens_per_request_are_limited(server):
    ids = [101, *range(2000, 2198), 102]  # 200 tokens: one fits under 300, two do not
    ok = httpx.post(f"{server.url}/predict", json={"input_ids": [ids]}, headers=auth())
    assert ok.status_code == 200
    over = httpx.post(f"{server.url}/predict", json={"input_ids": [ids, ids]}, headers=auth())
    assert over.status_code == 422
    assert "at most 300" in over.json()["error"]["message"]
