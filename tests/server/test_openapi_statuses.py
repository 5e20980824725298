"""The app's OpenAPI document lists the invalid-request status each dialect really answers."""

from __future__ import annotations

from ferry.server.app import create_app
from ferry.server.settings import Settings


def test_openai_routes_document_400_and_the_others_keep_422():
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
    # Ferry's own /predict and KServe keep the framework's 422, and answer it.
    assert "422" in paths["/predict"]["post"]["responses"]
    assert "422" in paths["/v2/models/{name}/infer"]["post"]["responses"]
