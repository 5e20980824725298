"""schemathesis hooks (SCHEMATHESIS_HOOKS=tests.server.fuzz_hooks): pin every `model` field and
the KServe `{name}` path parameter to the models the fuzzed server really serves, so requests
reach the batcher and the LLM engine instead of stopping at 404 "unknown model". Negative cases
still break the enum, which must then be refused with a 4xx."""

from __future__ import annotations

import os
from typing import Any

import schemathesis

LLM_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
ENCODER_PATHS = ("/predict", "/v1/embeddings")


def _pin(schema: dict[str, Any], name: str) -> None:
    model = schema["properties"]["model"]
    if "anyOf" in model:  # optional: the name or null (the default model)
        model["anyOf"] = [{"type": "string", "enum": [name]}, {"type": "null"}]
    else:
        model["enum"] = [name]


def _body_schema(operation: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """The JSON body's schema: a component (framework routes) or inline (hot routes)."""
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    ref = schema.get("$ref")
    return components[ref.rsplit("/", 1)[1]] if ref else schema


@schemathesis.hook
def before_load_schema(ctx, raw_schema: dict[str, Any]) -> None:
    encoder, llm = os.environ["FERRY_FUZZ_ENCODER"], os.environ["FERRY_FUZZ_LLM"]
    components = raw_schema["components"]["schemas"]
    for paths, name in ((LLM_PATHS, llm), (ENCODER_PATHS, encoder)):
        for path in paths:
            _pin(_body_schema(raw_schema["paths"][path]["post"], components), name)
    for path, operations in raw_schema["paths"].items():
        if path.startswith("/v2/models/{name}"):
            for operation in operations.values():
                for parameter in operation.get("parameters", []):
                    if parameter["name"] == "name":
                        parameter["schema"] = {"type": "string", "enum": [encoder]}
