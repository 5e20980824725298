"""The app's OpenAPI document lists the invalid-request status each dialect really answers."""

from __future__ import annotations

import pytest

from ferry.server.app import create_app
from ferry.server.settings import Settings

pytestmark = pytest.mark.unit


def test_openai_and_kserve_routes_document_400_and_ferrys_keep_422():
    paths = create_app(Settings()).openapi()["paths"]
    openai_posts = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/load_lora_adapter",
    ]
    for path in openai_posts:
        responses = paths[path]["post"]["responses"]
        assert "400" in responses and "422" not in responses, path
    assert "422" not in paths["/v1/models/{model_id}"]["get"]["responses"]
    # KServe v2 answers 400 as Triton does, on every /v2 route.
    v2 = [(p, ops) for p, ops in paths.items() if p.startswith("/v2")]
    assert v2
    for path, operations in v2:
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
    assert "400" in paths["/v2/models/{name}/infer"]["post"]["responses"]
    # Ferry's own /predict keeps the framework's 422, and answers it.
    assert "422" in paths["/predict"]["post"]["responses"]
