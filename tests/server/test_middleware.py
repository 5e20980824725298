"""The request middleware in-process (the real app over httpx's ASGI transport), judged only by
what a client sees: statuses, headers, bodies and the request counter."""

from __future__ import annotations

import pytest

from ferry.server.settings import Settings
from tests.server.inprocess import serving
from tests.support.metrics import metric_value

pytestmark = pytest.mark.unit

KEY = "k3y"
LIMIT = 2048


@pytest.fixture
async def http():
    async with serving(Settings(api_key=KEY, max_body_bytes=LIMIT)) as client:
        yield client


AUTH = {"Authorization": f"Bearer {KEY}"}
JSON_AUTH = {**AUTH, "Content-Type": "application/json"}


async def test_inference_needs_the_key_and_says_how(http):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = await http.post("/predict", json={"inputs": "x"}, headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["type"] == "authentication_error"
    # With the key the request reaches the route (no model here: 404 naming the model).
    response = await http.post("/predict", json={"model": "nope", "inputs": "x"}, headers=AUTH)
    assert response.status_code == 404 and "nope" in response.json()["error"]["message"]


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer  "])
async def test_the_auth_scheme_is_case_insensitive(http, scheme):
    headers = {"Authorization": f"{scheme} {KEY}"}
    response = await http.post("/predict", json={"model": "nope", "inputs": "x"}, headers=headers)
    assert response.status_code == 404  # past the key: no model here


@pytest.mark.parametrize("order", [(KEY, "wrong"), ("wrong", KEY), (KEY, KEY)])
async def test_two_authorization_headers_are_a_400_whatever_their_order(http, order):
    headers = [("authorization", f"Bearer {key}") for key in order]
    response = await http.post("/predict", json={"inputs": "x"}, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "authorization" and "2 Authorization headers" in error["message"]


@pytest.mark.parametrize(
    ("path", "content_type", "refused"),
    [
        ("/predict", "application/json", False),
        ("/predict", "application/json; charset=utf-8", False),
        ("/v1/embeddings", "Application/JSON", False),
        # What a page on another origin can post without a CORS preflight:
        ("/predict", None, True),
        ("/predict", "text/plain", True),
        ("/v1/chat/completions", "application/x-www-form-urlencoded", True),
        ("/v1/completions", "multipart/form-data; boundary=x", True),
        ("/v1/embeddings", "application/octet-stream", True),
        # KServe infer: tritonclient.http sends JSON-only requests with no type, its aio client
        # binary ones as octet-stream.
        ("/v2/models/nope/infer", None, False),
        ("/v2/models/nope/infer", "application/octet-stream", False),
        ("/v2/models/nope/infer", "text/plain", True),
        # The model repository extension: JSON, typed as each tritonclient types it.
        ("/v2/repository/models/nope/load", None, False),
        ("/v2/repository/models/nope/load", "application/octet-stream", False),
        ("/v2/repository/models/nope/load", "text/plain", True),
    ],
)
async def test_inference_bodies_must_be_declared_json(http, path, content_type, refused):
    headers = dict(AUTH) if content_type is None else {**AUTH, "Content-Type": content_type}
    body = b'{"model": "nope", "input": "x", "inputs": []}'
    response = await http.post(path, content=body, headers=headers)
    # Past the check, the request reaches its route: no model here, so a 404 or a 4xx refusal.
    assert (response.status_code == 415) == refused, response.text
    if refused:
        error = response.json()["error"]
        assert "Content-Type must be" in (error if isinstance(error, str) else error["message"])


async def test_a_post_where_none_is_served_is_still_a_405(http):
    for path in ("/v1/models", "/v2"):
        response = await http.post(path, content=b"x", headers=AUTH)
        assert response.status_code == 405, (path, response.text)


async def test_health_metrics_and_docs_stay_open(http):
    for path in ("/health/live", "/metrics", "/openapi.json", "/docs"):
        assert (await http.get(path)).status_code == 200, path


@pytest.mark.parametrize(
    ("path", "body"), [("/health/live", {"status": "alive"}), ("/v2/health/live", {"live": True})]
)
async def test_liveness_is_answered_with_its_documented_body_and_counted(http, path, body):
    # The gateway answers these itself; the framework's routes only document them.
    response = await http.get(path)
    assert response.status_code == 200 and response.json() == body
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"]
    text = (await http.get("/metrics")).text
    assert metric_value(text, "ferry_requests_total", endpoint=path, status="200") == 1


async def test_a_body_over_the_limit_is_413_by_its_length(http):
    response = await http.post("/predict", content=b"x" * (LIMIT + 1), headers=JSON_AUTH)
    assert response.status_code == 413
    assert f"{LIMIT}-byte limit" in response.json()["error"]["message"]


async def test_a_streamed_body_over_the_limit_is_413_too(http):
    async def chunks():
        for _ in range(4):
            yield b"x" * (LIMIT // 2)

    response = await http.post("/predict", content=chunks(), headers=JSON_AUTH)
    assert response.status_code == 413


async def test_a_body_at_the_limit_is_read(http):
    body = b'{"model": "nope", "inputs": "' + b"x" * (LIMIT - 31) + b'"}'
    assert len(body) <= LIMIT
    response = await http.post(
        "/predict", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert response.status_code == 404


async def test_refusals_are_counted_with_their_status(http):
    await http.post("/predict", json={})
    await http.post("/predict", content=b"x" * (LIMIT + 1), headers=JSON_AUTH)
    text = (await http.get("/metrics")).text
    assert metric_value(text, "ferry_requests_total", status="401") == 1
    assert metric_value(text, "ferry_requests_total", status="413") == 1


async def test_head_is_answered_as_get_without_a_body(http):
    got = await http.get("/health/live")
    head = await http.head("/health/live")
    assert head.status_code == got.status_code == 200
    assert head.headers["content-length"] == got.headers["content-length"] != "0"
    assert head.content == b""


async def test_metric_labels_come_from_routes_never_from_the_request(http):
    await http.post("/v2/models/client-chosen/infer", json={"inputs": []}, headers=AUTH)
    await http.get("/no/such/path", headers=AUTH)
    text = (await http.get("/metrics")).text
    # The route's template and no model: a client cannot add series by naming things.
    assert (
        metric_value(
            text, "ferry_requests_total", endpoint="/v2/models/{name}/infer", model="", status="404"
        )
        == 1
    )
    assert metric_value(text, "ferry_requests_total", endpoint="other", status="404") == 1
    assert "client-chosen" not in text and "/no/such/path" not in text
