"""The one error table, in-process: each domain exception raised inside the real app (its own
handlers and middleware, httpx's ASGI transport) comes out with its status, type and headers."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import Body

from ferry.backends.errors import BackendRejected, BackendTimeout, BackendUnavailable
from ferry.batcher.errors import (
    BatchAbandoned,
    BatcherClosed,
    DeadlineExceeded,
    InferenceFailed,
    InferenceTimedOut,
    InvalidInput,
    QueueFull,
)
from ferry.llm.errors import (
    AdapterNotLoaded,
    EngineDead,
    EngineOverloaded,
    GenerationFailed,
    InvalidAdapter,
    InvalidPrompt,
    InvalidSampling,
    PromptTooLong,
)
from ferry.server.app import create_app
from ferry.server.disconnect import ClientDisconnected
from ferry.server.errors import (
    ERROR_TABLE,
    BodyTooLarge,
    MalformedRequest,
    NotReady,
    Unauthorized,
    UnknownModel,
    UnsupportedMediaType,
)
from ferry.server.settings import Settings

# One instance of every class in the table, and what the caller must see for it.
CASES = [
    (InvalidInput("input_ids", "bad ids"), 422, "invalid_request_error", "input_ids"),
    (UnknownModel("nope", ["a"]), 404, "not_found_error", "model"),
    (BodyTooLarge(1024), 413, "invalid_request_error", None),
    (Unauthorized(), 401, "authentication_error", None),
    (QueueFull(retry_after_s=2.2), 429, "overloaded_error", None),
    (BatcherClosed("closing"), 503, "unavailable_error", None),
    (NotReady("starting"), 503, "unavailable_error", None),
    (BackendUnavailable("down"), 503, "unavailable_error", None),
    (BackendRejected("wrong dtype"), 422, "invalid_request_error", None),
    (DeadlineExceeded("late"), 504, "timeout_error", None),
    (BackendTimeout("slow"), 504, "timeout_error", None),
    (InferenceTimedOut("hung"), 504, "timeout_error", None),
    (BatchAbandoned("stopped"), 503, "unavailable_error", None),
    (InferenceFailed("boom"), 500, "internal_error", None),
    (InvalidSampling("temperature", "too hot"), 400, "invalid_request_error", "temperature"),
    (PromptTooLong(10, 5), 400, "invalid_request_error", "prompt"),
    (InvalidPrompt("prompt[1]", "id 9 is outside"), 400, "invalid_request_error", "prompt[1]"),
    (AdapterNotLoaded("x"), 404, "not_found_error", "model"),
    (EngineOverloaded("full"), 429, "overloaded_error", None),
    (EngineDead("dead"), 503, "unavailable_error", None),
    (GenerationFailed("failed"), 500, "internal_error", None),
    (MalformedRequest("not JSON"), 400, "invalid_request_error", None),
    (MalformedRequest("twice", "authorization"), 400, "invalid_request_error", "authorization"),
    (UnsupportedMediaType("text/plain", "application/json"), 415, "invalid_request_error", None),
    (ClientDisconnected("the client left"), 499, "cancelled_error", None),
    (InvalidAdapter("lora_path", "outside adapter_dir"), 400, "invalid_request_error", "lora_path"),
]
RETRY_AFTER = {429, 503}


@pytest.fixture
async def client():
    """The real app with no models, plus one route that raises whatever it is told to."""
    app = create_app(Settings())
    raising: dict[str, BaseException] = {}

    async def boom(key: str = Body(embed=True)) -> None:
        raise raising[key]

    app.add_api_route("/raise", boom, methods=["POST"])
    app.add_api_route("/v1/raise", boom, methods=["POST"])
    app.state.raising = raising
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://ferry") as http,
    ):
        yield app, http


async def raise_through(client, exc: BaseException, path: str = "/raise") -> httpx.Response:
    app, http = client
    app.state.raising["it"] = exc
    return await http.post(path, json={"key": "it"})


def test_every_table_entry_has_a_case():
    # (and subclasses with a case of their own, such as PromptTooLong, an InvalidPrompt)
    assert {cls for cls, _ in ERROR_TABLE} <= {type(c[0]) for c in CASES}


@pytest.mark.parametrize(("exc", "status", "type_", "param"), CASES, ids=lambda c: str(c)[:20])
async def test_each_domain_error_maps_to_its_status_and_type(client, exc, status, type_, param):
    response = await raise_through(client, exc)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == type_ and error["code"] == status and error["param"] == param
    assert error["message"] == (getattr(exc, "message", None) or str(exc))
    assert ("retry-after" in response.headers) == (status in RETRY_AFTER)
    assert ("www-authenticate" in response.headers) == (status == 401)


async def test_retry_after_rounds_the_estimate_up(client):
    response = await raise_through(client, QueueFull(retry_after_s=2.2))
    assert response.headers["retry-after"] == "3"


async def test_openai_paths_answer_400_where_others_answer_422(client):
    invalid = InvalidInput("input", "bad")
    assert (await raise_through(client, invalid, "/v1/raise")).status_code == 400
    assert (await raise_through(client, invalid, "/raise")).status_code == 422


async def test_validation_errors_name_the_field(client):
    _, http = client
    response = await http.post("/predict", json={"input_ids": [1, "x"]})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == "input_ids[1]" and error["message"].startswith("input_ids[1]: ")


async def test_an_unexpected_error_is_a_500_with_its_traceback_logged(client, caplog):
    caplog.set_level(logging.ERROR, logger="ferry.server.errors")
    response = await raise_through(client, KeyError("secret internal detail"))
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "internal server error",
        "type": "internal_error",
        "param": None,
        "code": 500,
    }
    (record,) = [r for r in caplog.records if r.name == "ferry.server.errors"]
    assert record.exc_info is not None and record.exc_info[0] is KeyError
    assert "/raise" in record.getMessage()


async def test_a_mapped_500_is_not_logged_as_a_bug(client, caplog):
    caplog.set_level(logging.ERROR, logger="ferry.server.errors")
    response = await raise_through(client, InferenceFailed("the model failed on this input"))
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "the model failed on this input"
    assert not [r for r in caplog.records if r.name == "ferry.server.errors"]
