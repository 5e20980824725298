"""One renderer per protocol, each checked over every kind of error the table holds."""

from __future__ import annotations

import grpc
import orjson
import pytest

from ferry.server.dialects import FERRY, KSERVE, OPENAI, sse_error
from ferry.server.errors import ERROR_TABLE, INTERNAL, Failure
from ferry.server.kserve.grpc_service import grpc_status
from ferry.server.replies import Reply

pytestmark = pytest.mark.unit

KINDS = sorted({kind for _, kind in ERROR_TABLE} | {INTERNAL}, key=lambda k: (k.status, k.type))


@pytest.fixture(
    params=[(kind, param) for kind in KINDS for param in (None, "input_ids[3]")],
    ids=lambda p: f"{p[0].status}-{p[0].type}-{p[1]}",
)
def failure(request) -> Failure:
    kind, param = request.param
    return Failure(kind.status, kind.type, "it broke", param, 2.2 if kind.retry_after else None)


def http_headers(reply: Reply) -> dict[bytes, bytes]:
    return dict(reply.headers)


def expected_headers(failure: Failure) -> dict[bytes, bytes]:
    headers = {b"retry-after": b"3"} if failure.retry_after_s is not None else {}
    return {**headers, b"www-authenticate": b"Bearer"} if failure.status == 401 else headers


@pytest.mark.parametrize(("dialect", "invalid_status"), [(OPENAI, 400), (FERRY, 422)])
def test_openai_json(failure, dialect, invalid_status):
    reply = dialect.reply(failure)
    status = invalid_status if failure.status == 422 else failure.status
    assert reply.status == status and reply.content_type == b"application/json"
    error = {"message": "it broke", "type": failure.type, "param": failure.param, "code": status}
    assert orjson.loads(reply.body) == {"error": error}
    assert http_headers(reply) == expected_headers(failure)


def test_kserve_json(failure):
    reply = KSERVE.reply(failure)
    assert reply.status == (400 if failure.status == 422 else failure.status)  # Triton's 400
    message = f"{failure.param}: it broke" if failure.param else "it broke"
    assert orjson.loads(reply.body) == {"error": message}
    assert http_headers(reply) == expected_headers(failure)


def test_sse_event(failure):
    event, done, end = sse_error(failure).split("\n\n")
    assert event.startswith("data: ") and done == "data: [DONE]" and end == ""
    assert orjson.loads(event.removeprefix("data: ")) == OPENAI.body(failure)


def test_grpc_status(failure):
    code, details, trailers = grpc_status(failure)
    assert (code == grpc.StatusCode.INTERNAL) == (failure.status == 500)
    assert code != grpc.StatusCode.UNKNOWN
    assert details == (f"{failure.param}: it broke" if failure.param else "it broke")
    assert trailers == ((("retry-after", "1"),) if failure.retry_after_s is not None else ())


def test_a_field_already_leading_the_message_is_not_named_twice():
    failure = Failure(422, "invalid_request_error", "inputs[1]: too long", "inputs[1]")
    assert orjson.loads(KSERVE.reply(failure).body) == {"error": "inputs[1]: too long"}


@pytest.mark.parametrize("dialect", [OPENAI, KSERVE])
def test_a_lone_surrogate_quoted_from_a_request_still_gets_an_answer(dialect):
    failure = Failure(404, "not_found_error", "model 'a\ud800' is unknown", "model")
    error = orjson.loads(dialect.reply(failure).body)["error"]
    assert "model 'a\\ud800' is unknown" in (error if isinstance(error, str) else error["message"])
