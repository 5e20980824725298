"""schemathesis hooks (SCHEMATHESIS_HOOKS=tests.server.fuzz_hooks): pin every `model` field and
the KServe `{name}` path parameter to the models the fuzzed server really serves, so requests
reach the batcher and the LLM engine instead of stopping at 404 "unknown model". Negative cases
still break the enum, which must then be refused with a 4xx.

Two more kinds of hostile request are generated: KServe infer bodies with tensors of every
datatype and mismatched data, and completions with hundreds of prompts (x `n`). After every
answer, `loop_stayed_responsive` checks that the server's event loop never stalled: a thread
polls /health/live all along, and the slowest answer since the last check is judged as
tests/support/liveness.py judges it, against this run's own times (no wall-clock bound): past
half the case's own time and past a few of the idle polls made before the first case is a
freeze, if it comes back when the case is sent again. After an inference request, a normal
/predict must still be answered 200.
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import schemathesis

from tests.support.liveness import ContinuousProbe

KSERVE_DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
)  # fmt: skip
MISMATCHED_ITEM = {
    "anyOf": [
        {"type": "integer"},
        {"type": "number"},
        {"type": "string", "maxLength": 8},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
    ]
}
KSERVE_BODY = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "inputs": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {
                "type": "object",
                "required": ["name", "shape", "datatype", "data"],
                "properties": {
                    "name": {"enum": ["input_ids", "attention_mask", "text"]},
                    "shape": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0, "maximum": 16},
                        "minItems": 1,
                        "maxItems": 3,
                    },
                    "datatype": {"enum": list(KSERVE_DATATYPES)},
                    "data": {"type": "array", "items": MISMATCHED_ITEM, "maxItems": 16},
                },
            },
        }
    },
}
# Beyond the engine's max_running + max_waiting (2 + 64 in the test), with or without n.
MANY_PROMPTS = {
    "type": "array",
    "items": {"type": "string", "minLength": 1, "maxLength": 4},
    "minItems": 60,
    "maxItems": 300,
}

LLM_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
)
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
    infer = raw_schema["paths"]["/v2/models/{name}/infer"]["post"]
    infer["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": KSERVE_BODY}},
    }
    prompt = components["CompletionRequest"]["properties"]["prompt"]
    prompt["anyOf"] = [*prompt["anyOf"], MANY_PROMPTS]
    for path, operations in raw_schema["paths"].items():
        if path.startswith("/v2/models/{name}"):
            for operation in operations.values():
                for parameter in operation.get("parameters", []):
                    if parameter["name"] == "name":
                        parameter["schema"] = {"type": "string", "enum": [encoder]}


_probe: ContinuousProbe | None = None
INFERENCE = ("/predict", "/v1/", "/v2/models/")
REPLAYS = 2
# One client for the follow-up /predict and the replays: `httpx.post` builds a client (and its
# TLS context) per call, ~0.1 s on this box, which was most of the fuzzer's time (thousands of
# cases, each followed by a /predict).
_client = httpx.Client(timeout=60)


@schemathesis.hook
def before_call(ctx, case, **kwargs) -> None:
    # The probe's idle polls go out before the first case, while the server has nothing to do.
    global _probe
    if _probe is None:
        _probe = ContinuousProbe(case.operation.schema.get_base_url())


@schemathesis.check
def loop_stayed_responsive(ctx, response, case) -> None:
    assert _probe is not None, "before_call starts the probe"
    problem = _froze(_probe, response.request, response.elapsed)
    # A freeze the request's work causes comes back when it is sent again; a poll that the loaded
    # machine delayed (thousands of cases, each judged) does not. So a suspect request is sent
    # again once the loop answers as when idle, each time in a window of its own, and fails only
    # if every send froze the loop.
    for _ in range(REPLAYS):
        if problem is None:
            return
        _probe.settle()
        _probe.slowest()  # the window starts now
        started = time.perf_counter()
        _client.request(
            response.request.method,
            response.request.url,
            headers={k: v for k, v in response.request.headers.items() if k != "Content-Length"},
            content=response.request.body,
        )
        problem = _froze(_probe, response.request, time.perf_counter() - started)
    assert problem is None, f"{problem}, and again on each of {REPLAYS} replays"


def _froze(probe: ContinuousProbe, request, request_s: float) -> str | None:
    """Whether the loop froze around one request (and, after an inference, a normal /predict
    that must still be answered 200)."""
    url = urlsplit(str(request.url))
    problem = probe.freeze(request_s, f"{request.method} {url.path}")
    if problem or not url.path.startswith(INFERENCE) or request.method != "POST":
        return problem
    started = time.perf_counter()
    base = f"{url.scheme}://{url.netloc}"
    answer = _client.post(f"{base}/predict", json={"input_ids": [101, 7592, 102]})
    assert answer.status_code == 200, f"a normal /predict got {answer.status_code} after it"
    return probe.freeze(time.perf_counter() - started, "a normal /predict after it")
