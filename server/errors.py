"""Domain exceptions mapped to HTTP in one table, with OpenAI-shaped error bodies.

Everything below the routes raises its own exceptions; only this module knows status codes.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

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
    shown_name,
)
from ferry.server.disconnect import ClientDisconnected
from ferry.server.json_errors import field_at, json_error

logger = logging.getLogger(__name__)


class UnknownModel(Exception):
    field = "model"

    def __init__(self, name: str, known: list[str]) -> None:
        shown = shown_name(name)
        super().__init__(f"model {shown!r} is not served here; known models: {', '.join(known)}")


class NotReady(Exception):
    """The service is starting or draining."""


class Unauthorized(Exception):
    def __init__(self) -> None:
        super().__init__("missing or wrong API key: send 'Authorization: Bearer <key>'")


class MalformedRequest(Exception):
    """A body that is not the protocol's shape at all (not JSON, tensors that do not fit): 400.
    `field` names where, when that is known."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnsupportedMediaType(Exception):
    def __init__(self, given: str, accepted: str) -> None:
        shown = repr(given[:80]) if given else "none"
        super().__init__(f"Content-Type must be {accepted}; got {shown}")


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than the {limit}-byte limit")


@dataclass(frozen=True)
class ErrorKind:
    status: int
    type: str
    retry_after: bool = False


# The one table: exception class -> status and error type. First match wins (subclasses first).
ERROR_TABLE: tuple[tuple[type[BaseException], ErrorKind], ...] = (
    (InvalidInput, ErrorKind(422, "invalid_request_error")),
    (MalformedRequest, ErrorKind(400, "invalid_request_error")),
    # nginx's status for a client that closed the connection first; nobody reads the body.
    (ClientDisconnected, ErrorKind(499, "cancelled_error")),
    (UnknownModel, ErrorKind(404, "not_found_error")),
    (BodyTooLarge, ErrorKind(413, "invalid_request_error")),
    (UnsupportedMediaType, ErrorKind(415, "invalid_request_error")),
    (Unauthorized, ErrorKind(401, "authentication_error")),
    (QueueFull, ErrorKind(429, "overloaded_error", retry_after=True)),
    (BatcherClosed, ErrorKind(503, "unavailable_error", retry_after=True)),
    (NotReady, ErrorKind(503, "unavailable_error", retry_after=True)),
    (BackendUnavailable, ErrorKind(503, "unavailable_error", retry_after=True)),
    (BackendRejected, ErrorKind(422, "invalid_request_error")),
    (DeadlineExceeded, ErrorKind(504, "timeout_error")),
    (BackendTimeout, ErrorKind(504, "timeout_error")),
    (InferenceTimedOut, ErrorKind(504, "timeout_error")),
    (BatchAbandoned, ErrorKind(503, "unavailable_error", retry_after=True)),
    (InferenceFailed, ErrorKind(500, "internal_error")),
    (InvalidSampling, ErrorKind(400, "invalid_request_error")),
    (InvalidAdapter, ErrorKind(400, "invalid_request_error")),
    (InvalidPrompt, ErrorKind(400, "invalid_request_error")),  # PromptTooLong is one
    (AdapterNotLoaded, ErrorKind(404, "not_found_error")),
    (EngineOverloaded, ErrorKind(429, "overloaded_error", retry_after=True)),
    (EngineDead, ErrorKind(503, "unavailable_error", retry_after=True)),
    (GenerationFailed, ErrorKind(500, "internal_error")),
)
INTERNAL = ErrorKind(500, "internal_error")
# FastAPI's detail for a body its JSON parser raised on other than a decode error (recursion).
PARSE_FAILED = "There was an error parsing the body"


def error_body(message: str, type_: str, param: str | None = None, code: int | None = None):
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def is_kserve(path: str) -> bool:
    """KServe v2 clients (tritonclient, perf_analyzer) read `{"error": "..."}`, not OpenAI's."""
    return path == "/v2" or path.startswith("/v2/")


def kserve_body(message: str, param: str | None) -> dict[str, str]:
    named = not param or message.startswith(f"{param}:")
    return {"error": message if named else f"{param}: {message}"}


def _shaped(path: str, message: str, type_: str, param: str | None, status: int) -> dict:
    if is_kserve(path):
        return kserve_body(message, param)
    return error_body(message, type_, param, status)


def _openai_status(path: str, status: int) -> int:
    # OpenAI (and vLLM) answer 400 where FastAPI's convention is 422.
    return 400 if status == 422 and path.startswith("/v1/") else status


def error_payload(exc: BaseException, path: str = "") -> tuple[ErrorKind, dict]:
    """The table's status and OpenAI-shaped body for an exception: HTTP answers and in-stream
    SSE error events both come from here."""
    base = next((k for cls, k in ERROR_TABLE if isinstance(exc, cls)), INTERNAL)
    if base is INTERNAL:
        # Not in the table: a bug, not a domain error. Its traceback is what finds it.
        logger.error("unhandled error on %s", path or "?", exc_info=exc)
    kind = ErrorKind(_openai_status(path, base.status), base.type, base.retry_after)
    param = getattr(exc, "field", None)
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if base is INTERNAL:
        message = "internal server error"  # the details are in the log, not for the caller
    return kind, error_body(message, kind.type, param, kind.status)


def error_parts(exc: BaseException, path: str = "") -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, body and headers for an exception: the one table, in the path's error shape."""
    if isinstance(exc, ValidationError):
        return _validation_parts(exc.errors(), path)
    kind, body = error_payload(exc, path)
    headers = {}
    if kind.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if kind.retry_after:
        headers["Retry-After"] = str(math.ceil(getattr(exc, "retry_after_s", 1.0)))
    if is_kserve(path):
        body = kserve_body(body["error"]["message"], body["error"]["param"])
    return kind.status, body, headers


def error_response(exc: BaseException, path: str = "") -> Response:
    status, body, headers = error_parts(exc, path)
    return _json(body, status, headers)


def render_error(
    path: str,
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The error body in the shape the path's clients expect."""
    return _json(_shaped(path, message, type_, param, status), status, headers)


def _json(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    # ASCII-escaped: a message may quote client text with lone surrogates, which UTF-8 cannot
    # encode; the answer must still go out (and not as a 500).
    text = json.dumps(body, ensure_ascii=True)
    return Response(text, status, headers, media_type="application/json")


def _validation_parts(
    errors: Sequence[Any], path: str, body: Any = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        param, message = _json_invalid(first, body)
    else:
        param = _param_from_loc(first.get("loc", ()))
        message = str(first["msg"]).removeprefix("Value error, ")  # pydantic's, says nothing
    message = f"{param}: {message}" if param else message
    status = _openai_status(path, 422)
    return status, _shaped(path, message, "invalid_request_error", param, status), {}


def _json_invalid(error: Any, body: Any) -> tuple[str | None, str]:
    """A body that is not JSON: the field where it breaks, when one can be named. pydantic keeps
    the body as the error's input; FastAPI passes it (as text) with the offset in `loc`."""
    raw = error.get("input") if body is None else body
    detail = (error.get("ctx") or {}).get("error")
    message = f"Invalid JSON: {detail}" if detail else str(error["msg"])
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if not isinstance(raw, bytes):
        return None, message
    loc = error.get("loc", ())
    position = loc[-1] if loc and isinstance(loc[-1], int) else None
    param, plain = json_error(raw, message, position)
    return param, f"Invalid JSON: {plain}" if plain != message else message


def body_parse_error(body: bytes) -> tuple[str | None, str]:
    """A body the framework's JSON parser gave up on (nesting past Python's recursion limit)."""
    return field_at(body), "Invalid JSON: nested too deeply"


def _param_from_loc(loc: tuple) -> str | None:
    """('body', 'input_ids', 'list[int]', 3) -> 'input_ids[3]': pydantic's union tags dropped."""
    parts = [p for p in loc if p != "body"]
    if not parts:
        return None
    param = str(parts[0])
    for part in parts[1:]:
        if isinstance(part, int):
            param += f"[{part}]"
    return param


def install_error_handlers(app: FastAPI) -> None:
    async def on_domain_error(request: Request, exc: Exception) -> Response:
        return error_response(exc, request.url.path)

    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        json_body = exc.body if errors and errors[0].get("type") == "json_invalid" else None
        status, body, headers = _validation_parts(errors, request.url.path, json_body)
        return _json(body, status, headers)

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == PARSE_FAILED:
            # The gateway read the body already (inference routes) and keeps it for this.
            param, message = body_parse_error(getattr(request.state, "raw_body", b""))
            path = request.url.path
            return render_error(path, 400, message, "invalid_request_error", param)
        return render_error(
            request.url.path,
            exc.status_code,
            str(exc.detail),
            "invalid_request_error",
            headers=exc.headers,
        )

    for cls, _kind in ERROR_TABLE:
        app.add_exception_handler(cls, on_domain_error)
    # Anything else: an OpenAI-shaped 500 whose traceback is logged (Starlette re-raises it after).
    app.add_exception_handler(Exception, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
