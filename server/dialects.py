"""One renderer per protocol for the one error table: OpenAI JSON, KServe JSON, SSE events.

Each route's dialect is declared once, in `route_table.py` (with a request no route claims
answered in the dialect its path's family shares there), which the hot routes, the gateway and
the framework's error handlers read.
Every body is encoded by `replies.dumps` (orjson). The gRPC status, the fourth dialect, lives
with the gRPC service (`kserve/grpc_service.py`), which only exists when grpcio is installed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ferry.server.errors import (
    ERROR_TABLE,
    PARSE_FAILED,
    Failure,
    body_parse_error,
    failure,
    validation_failure,
)
from ferry.server.replies import Reply, dumps


class ErrorDialect(Protocol):
    @property
    def invalid_status(self) -> int:
        """The status an invalid request is answered with (what the API documents)."""
        ...

    def reply(self, failure: Failure, headers: dict[str, str] | None = None) -> Reply: ...


def http_headers(
    failure: Failure, extra: dict[str, str] | None = None
) -> tuple[tuple[bytes, bytes], ...]:
    headers = [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
    if failure.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if failure.retry_after_s is not None:
        headers.append((b"retry-after", str(math.ceil(failure.retry_after_s)).encode()))
    return tuple(headers)


def _encoded(shape: Callable[[Failure], dict[str, Any]], failure: Failure) -> bytes:
    """The body `shape` gives `failure`, as JSON bytes."""
    try:
        return dumps(shape(failure))
    except TypeError:
        # A message quoting client text with a lone surrogate (UTF-8 cannot carry it): the
        # answer still goes out, with the surrogate written as its escape.
        def safe(text: str | None) -> str | None:
            return text if text is None else text.encode("utf-8", "backslashreplace").decode()

        return dumps(
            shape(
                replace(
                    failure,
                    message=cast(str, safe(failure.message)),  # str in, str out
                    param=safe(failure.param),
                )
            )
        )


def answered_status(failure: Failure, invalid_status: int) -> int:
    """The table's 422 (FastAPI's convention for an invalid request) as the dialect answers it."""
    return invalid_status if failure.status == 422 else failure.status


@dataclass(frozen=True)
class OpenAIJson:
    """`{"error": {message, type, param, code}}`. OpenAI (and vLLM) answer a request they refuse
    400, where FastAPI's convention, kept on Ferry's own routes, is 422."""

    invalid_status: int = 422

    def status(self, failure: Failure) -> int:
        return answered_status(failure, self.invalid_status)

    def body(self, failure: Failure) -> dict[str, Any]:
        error = {"message": failure.message, "type": failure.type, "param": failure.param}
        return {"error": {**error, "code": self.status(failure)}}

    def reply(self, failure: Failure, headers: dict[str, str] | None = None) -> Reply:
        body = _encoded(self.body, failure)
        return Reply(self.status(failure), body, headers=http_headers(failure, headers))


def kserve_message(failure: Failure) -> str:
    """KServe's one string: Triton's own words where it has them, else the field leads the
    message, as Triton names the tensor."""
    if failure.kserve_message is not None:
        return failure.kserve_message
    param, message = failure.param, failure.message
    return message if not param or message.startswith(f"{param}:") else f"{param}: {message}"


@dataclass(frozen=True)
class KServeJson:
    """`{"error": "..."}`: what tritonclient and perf_analyzer read. Triton (and the KServe v2
    protocol) answer every request they refuse 400, never FastAPI's 422."""

    invalid_status: int = 400

    def status(self, failure: Failure) -> int:
        return answered_status(failure, self.invalid_status)

    def body(self, failure: Failure) -> dict[str, Any]:
        return {"error": kserve_message(failure)}

    def reply(self, failure: Failure, headers: dict[str, str] | None = None) -> Reply:
        body = _encoded(self.body, failure)
        return Reply(self.status(failure), body, headers=http_headers(failure, headers))


# Anthropic's error types, named by status (its API's table); any other status is an api_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


@dataclass(frozen=True)
class AnthropicJson:
    """`{"type": "error", "error": {type, message}}`, as the anthropic SDK reads it; a refused
    request is a 400, and the message names the field (there is no `param`)."""

    invalid_status: int = 400

    def status(self, failure: Failure) -> int:
        return answered_status(failure, self.invalid_status)

    def body(self, failure: Failure) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(self.status(failure), "api_error")
        if 400 <= self.status(failure) < 500 and kind == "api_error":
            kind = "invalid_request_error"
        return {"type": "error", "error": {"type": kind, "message": kserve_message(failure)}}

    def reply(self, failure: Failure, headers: dict[str, str] | None = None) -> Reply:
        body = _encoded(self.body, failure)
        return Reply(self.status(failure), body, headers=http_headers(failure, headers))


OPENAI = OpenAIJson(invalid_status=400)
ANTHROPIC = AnthropicJson()
FERRY = OpenAIJson(invalid_status=422)  # /predict, health, metrics: OpenAI's shape, 422 kept
KSERVE = KServeJson()
DONE = "data: [DONE]\n\n"


def sse_error(failure: Failure, dialect: OpenAIJson = OPENAI) -> str:
    """An error after a stream began (its status already sent): one `data:` event in the
    stream's own error shape, then `[DONE]`, as OpenAI's clients expect."""
    body = _encoded(dialect.body, failure)
    return f"data: {body.decode()}\n\n{DONE}"


def install_error_handlers(app: FastAPI, dialect_of: Callable[[str], ErrorDialect]) -> None:
    """The framework's routes answer errors in their route's dialect (`dialect_of` a path)."""

    def respond(
        request: Request, failure: Failure, headers: dict[str, str] | None = None
    ) -> Response:
        reply = dialect_of(request.url.path).reply(failure, headers)
        extra = {k.decode(): v.decode() for k, v in reply.headers}
        return Response(reply.body, reply.status, extra, media_type=reply.content_type.decode())

    async def on_domain_error(request: Request, exc: Exception) -> Response:
        return respond(request, failure(exc, request.url.path))

    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        json_body = exc.body if errors and errors[0].get("type") == "json_invalid" else None
        return respond(request, validation_failure(errors, json_body))

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == PARSE_FAILED:
            # The gateway read the body already and keeps it for this.
            param, message = body_parse_error(getattr(request.state, "raw_body", b""))
            return respond(request, Failure(400, "invalid_request_error", message, param))
        bare = Failure(exc.status_code, "invalid_request_error", str(exc.detail))
        headers = cast("dict[str, str] | None", exc.headers)  # a dict, or None
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
        return respond(request, bare, headers)

    for cls, _kind in ERROR_TABLE:
        app.add_exception_handler(cls, on_domain_error)
    # Anything else: a 500 whose traceback is logged (Starlette re-raises it after).
    app.add_exception_handler(Exception, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]  # called only with its class
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]  # as above


def allowed_methods(request: Request) -> list[str]:
    """Every method the path serves, from the route table: the router's own 405 names only the
    first route that matched, where a GET and a POST are two routes."""
    from ferry.server.route_table import HTTP_ROUTES  # the table imports this module's dialects

    route = HTTP_ROUTES.find(request.url.path)
    return sorted(route.methods) if route is not None else []
