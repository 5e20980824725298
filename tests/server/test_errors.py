"""The one error table: an exception becomes a Failure (status, type, message, field, retry)
once; every dialect renders from that (tests/server/test_dialects.py)."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import Body
from pydantic import BaseModel, ValidationError

from ferry.batcher.errors import InferenceFailed, QueueFull
from ferry.server.app import create_app
from ferry.server.errors import (
    ERROR_TABLE,
    Failure,
    InvalidInput,
    UnknownModel,
    failure,
    validation_failure,
)
from ferry.server.settings import Settings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("index", range(len(ERROR_TABLE)), ids=lambda i: ERROR_TABLE[i][0].__name__)
def test_no_entry_is_shadowed_by_an_earlier_one(index):
    """First match wins, so a subclass listed after its base would never be reached."""
    cls = ERROR_TABLE[index][0]
    assert not [base for base, _ in ERROR_TABLE[:index] if issubclass(cls, base)]


def test_the_status_and_type_come_from_the_table_the_rest_from_the_exception():
    assert failure(InvalidInput("input_ids", "bad ids")) == Failure(
        422, "invalid_request_error", "bad ids", "input_ids"
    )
    unknown = failure(UnknownModel("nope", ["a", "b"]))
    assert (unknown.status, unknown.type, unknown.param) == (404, "not_found_error", "model")
    assert unknown.message == "model 'nope' is not served here; known models: a, b"


def test_a_retry_estimate_travels_only_where_the_table_says_a_retry_can_succeed():
    assert failure(QueueFull(retry_after_s=2.2)).retry_after_s == 2.2
    assert failure(InvalidInput("x", "y")).retry_after_s is None


def test_a_subclass_takes_its_bases_entry():
    class Crowded(QueueFull):
        pass

    crowded = failure(Crowded(retry_after_s=0.5))
    assert (crowded.status, crowded.type, crowded.retry_after_s) == (429, "overloaded_error", 0.5)


def test_an_unexpected_error_is_a_500_whose_details_are_logged_not_shown(caplog):
    caplog.set_level(logging.ERROR, logger="ferry.server.errors")
    assert failure(KeyError("secret internal detail"), "/raise") == Failure(
        500, "internal_error", "internal server error"
    )
    (record,) = [r for r in caplog.records if r.name == "ferry.server.errors"]
    assert record.exc_info is not None and record.exc_info[0] is KeyError
    assert "/raise" in record.getMessage()


def test_a_mapped_500_is_not_logged_as_a_bug(caplog):
    caplog.set_level(logging.ERROR, logger="ferry.server.errors")
    assert failure(InferenceFailed("the model failed")).message == "the model failed"
    assert not [r for r in caplog.records if r.name == "ferry.server.errors"]


class Ids(BaseModel):
    input_ids: list[int]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (b'{"input_ids": [1, "x"]}', "input_ids[1]", "input_ids[1]: Input should be a valid"),
        (b'{"input_ids": [1, 2,]}', "input_ids[2]", "input_ids[2]: Invalid JSON: trailing comma"),
        (b"[]", None, "Input should be an object"),
    ],
)
def test_a_validation_error_is_a_422_naming_the_field(body, param, message):
    with pytest.raises(ValidationError) as raised:
        Ids.model_validate_json(body)
    assert failure(raised.value) == validation_failure(raised.value.errors())
    got = failure(raised.value)
    assert (got.status, got.param) == (422, param) and got.message.startswith(message), got


@pytest.fixture
async def client():
    """The real app with no models, plus framework routes that raise what they are told to."""
    app = create_app(Settings())
    raising: dict[str, BaseException] = {}

    async def boom(key: str = Body(embed=True)) -> None:
        raise raising[key]

    for path in ("/raise", "/v1/raise", "/v2/raise"):
        app.add_api_route(path, boom, methods=["POST"])
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://ferry") as http,
    ):
        yield raising, http


@pytest.mark.parametrize(
    ("path", "status", "body"),
    [
        (
            "/raise",
            422,
            {
                "error": {
                    "message": "bad",
                    "type": "invalid_request_error",
                    "param": "input",
                    "code": 422,
                }
            },
        ),
        (
            "/v1/raise",
            400,
            {
                "error": {
                    "message": "bad",
                    "type": "invalid_request_error",
                    "param": "input",
                    "code": 400,
                }
            },
        ),
        ("/v2/raise", 400, {"error": "input: bad"}),
    ],
)
async def test_framework_routes_answer_in_the_dialect_mounted_on_their_prefix(
    client, path, status, body
):
    raising, http = client
    raising["it"] = InvalidInput("input", "bad")
    response = await http.post(path, json={"key": "it"})
    assert (response.status_code, response.json()) == (status, body)


async def test_retry_after_and_the_unknown_500_through_a_framework_route(client):
    raising, http = client
    raising["full"], raising["bug"] = QueueFull(retry_after_s=2.2), KeyError("secret")
    full = await http.post("/raise", json={"key": "full"})
    assert (full.status_code, full.headers["retry-after"]) == (429, "3")
    bug = await http.post("/raise", json={"key": "bug"})
    assert bug.status_code == 500 and "secret" not in bug.text
