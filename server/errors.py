"""Domain exceptions mapped to HTTP in one table, with OpenAI-shaped error bodies.

Everything below the routes raises its own exceptions; only this module knows status codes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
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
    EngineDead,
    EngineOverloaded,
    GenerationFailed,
    InvalidSampling,
    ModelNotFound,
    PromptTooLong,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class UnknownModel(Exception):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"model {name!r} is not served here; known models: {', '.join(known)}")


class NotReady(Exception):
    """The service is starting or draining."""


class Unauthorized(Exception):
    def __init__(self) -> None:
        super().__init__("missing or wrong API key: send 'Authorization: Bearer <key>'")


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
    (UnknownModel, ErrorKind(404, "not_found_error")),
    (BodyTooLarge, ErrorKind(413, "invalid_request_error")),
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
    (PromptTooLong, ErrorKind(400, "invalid_request_error")),
    (ModelNotFound, ErrorKind(404, "not_found_error")),
    (EngineOverloaded, ErrorKind(429, "overloaded_error", retry_after=True)),
    (EngineDead, ErrorKind(503, "unavailable_error", retry_after=True)),
    (GenerationFailed, ErrorKind(500, "internal_error")),
)
INTERNAL = ErrorKind(500, "internal_error")


def error_body(message: str, type_: str, param: str | None = None, code: int | None = None):
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _openai_status(path: str, status: int) -> int:
    # OpenAI (and vLLM) answer 400 where FastAPI's convention is 422.
    return 400 if status == 422 and path.startswith("/v1/") else status


def error_response(exc: BaseException, path: str = "") -> JSONResponse:
    matched = next((k for cls, k in ERROR_TABLE if isinstance(exc, cls)), INTERNAL)
    if matched is INTERNAL:
        # Not in the table: a bug, not a domain error. Its traceback is what finds it.
        logger.error("unhandled error on %s", path or "?", exc_info=exc)
    kind = ErrorKind(_openai_status(path, matched.status), matched.type, matched.retry_after)
    param = getattr(exc, "field", None)
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if matched is INTERNAL:
        message = "internal server error"  # the details are in the log, not for the caller
    headers = {}
    if kind.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if kind.retry_after:
        headers["Retry-After"] = str(math.ceil(getattr(exc, "retry_after_s", 1.0)))
    return JSONResponse(
        error_body(message, kind.type, param, kind.status), kind.status, headers=headers
    )


def _validation_response(exc: RequestValidationError, path: str) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    param = _param_from_loc(first.get("loc", ()))
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    status = _openai_status(path, 422)
    return JSONResponse(error_body(message, "invalid_request_error", param, status), status)


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
    async def on_domain_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, request.url.path)

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc, request.url.path)

    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(str(exc.detail), "invalid_request_error", None, exc.status_code),
            exc.status_code,
            headers=exc.headers,
        )

    for cls, _kind in ERROR_TABLE:
        app.add_exception_handler(cls, on_domain_error)
    # Anything else: an OpenAI-shaped 500 whose traceback is logged (Starlette re-raises it after).
    app.add_exception_handler(Exception, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
