"""Domain exceptions mapped to statuses in one table.

Everything below the routes raises its own exceptions; only this module knows status codes.
`failure` looks an exception up once; the dialects (`server/dialects.py`, and the gRPC status in
`kserve/grpc_service.py`) render the result in the shape each protocol's clients read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ferry.backends.errors import BackendRejected, BackendTimeout, BackendUnavailable
from ferry.batcher.errors import (
    BatchAbandoned,
    BatcherClosed,
    DeadlineExceeded,
    InferenceFailed,
    InferenceTimedOut,
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


class InvalidInput(Exception):
    """A request that can never run, refused before any work: a 422 (400 in the OpenAI and
    KServe dialects) naming the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in an image decoding process (server/image_inputs.py) and pickled back.
        return (type(self), (self.field, self.message))


class TooManyItems(InvalidInput):
    """More items in one request than the server ever takes at once: a 413 naming the field
    (not a 429, which says a retry may succeed)."""


class UnknownModel(Exception):
    field = "model"

    def __init__(self, name: str, known: list[str]) -> None:
        shown = shown_name(name)
        super().__init__(f"model {shown!r} is not served here; known models: {', '.join(known)}")
        # Triton's words, which its clients match (`startswith("Request for unknown model")`);
        # KServe does not list the served models (GET /v2/repository/index would).
        self.kserve_message = f"Request for unknown model: '{shown}' is not found"


class UnknownModelVersion(Exception):
    """A model asked for by a version it does not have (Ferry serves one version a model)."""

    field = "model_version"

    def __init__(self, name: str, version: str, served: str) -> None:
        shown = shown_name(version)
        super().__init__(
            f"model {name!r} has no version {shown!r}; it serves version {served} "
            "(or leave the version out)"
        )
        self.kserve_message = f"Request for unknown model: '{name}' version {shown} is not found"


class ModelControlOff(Exception):
    """A load or unload while the server's model control mode is not "explicit": 403, with
    Triton's sentence first (its clients look for it)."""

    field = "model_control_mode"


class LoadRefused(Exception):
    """A load request Ferry cannot honour (a config override it cannot map, a file override):
    a 400 naming the field, Triton's "failed to load '<model>'" first."""

    def __init__(self, model: str, field: str, reason: str, action: str = "load") -> None:
        self.field = field
        self.message = f"failed to {action} '{shown_name(model)}': {reason}"
        super().__init__(self.message)


class LoadFailed(Exception):
    """A model that could not be started (its files, its runtime): 500, logged."""


class NotInRepository(Exception):
    """A load or unload of a name the model repository does not hold: 404."""

    field = "model"

    def __init__(self, action: str, model: str) -> None:
        super().__init__(
            f"failed to {action} '{shown_name(model)}': no model of that name in the model "
            "repository (the server's models and llm_models)"
        )


class NotReady(Exception):
    """The service is starting or draining."""


class Unauthorized(Exception):
    def __init__(self) -> None:
        super().__init__("missing or wrong API key: send 'Authorization: Bearer <key>'")


class Forbidden(Exception):
    """A valid request asking for what its API key (or the lack of one) may not have: 403
    naming the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class NotSupported(Exception):
    """A part of a protocol Ferry does not serve (CUDA shared memory): a 400 naming the field,
    UNIMPLEMENTED on gRPC, with what to use instead."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


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


class UnsupportedEncoding(Exception):
    """A request body in a Content-Encoding the server does not inflate: 415, as RFC 9110 says."""

    field = "Content-Encoding"

    def __init__(self, given: str, accepted: tuple[str, ...]) -> None:
        super().__init__(
            f"Content-Encoding must be {', '.join(accepted)} or identity; got {given[:80]!r}"
        )


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than the {limit}-byte limit")


class RequestTimeout(Exception):
    """The request head or body did not arrive in time (the connection is closed)."""


class HeadTooLarge(Exception):
    """A request head over the byte or line limit (the connection is closed)."""


class TooManyConnections(Exception):
    def __init__(self) -> None:
        super().__init__("too many open connections; retry later")


NOT_SUPPORTED = "not_supported_error"  # an error type the gRPC dialect answers UNIMPLEMENTED


@dataclass(frozen=True)
class ErrorKind:
    status: int
    type: str
    retry_after: bool = False


# The one table: exception class -> status and error type. First match wins (subclasses first).
ERROR_TABLE: tuple[tuple[type[Exception], ErrorKind], ...] = (
    (TooManyItems, ErrorKind(413, "invalid_request_error")),
    (InvalidInput, ErrorKind(422, "invalid_request_error")),
    (MalformedRequest, ErrorKind(400, "invalid_request_error")),
    (NotSupported, ErrorKind(400, NOT_SUPPORTED)),
    # nginx's status for a client that closed the connection first; nobody reads the body.
    (ClientDisconnected, ErrorKind(499, "cancelled_error")),
    (UnknownModel, ErrorKind(404, "not_found_error")),
    (NotInRepository, ErrorKind(404, "not_found_error")),
    (LoadRefused, ErrorKind(400, "invalid_request_error")),
    (ModelControlOff, ErrorKind(403, "permission_error")),
    (LoadFailed, ErrorKind(500, "internal_error")),
    (UnknownModelVersion, ErrorKind(404, "not_found_error")),
    (BodyTooLarge, ErrorKind(413, "invalid_request_error")),
    (UnsupportedMediaType, ErrorKind(415, "invalid_request_error")),
    (UnsupportedEncoding, ErrorKind(415, "invalid_request_error")),
    (RequestTimeout, ErrorKind(408, "timeout_error")),
    (HeadTooLarge, ErrorKind(431, "invalid_request_error")),
    (TooManyConnections, ErrorKind(503, "unavailable_error", retry_after=True)),
    (Unauthorized, ErrorKind(401, "authentication_error")),
    (Forbidden, ErrorKind(403, "permission_error")),
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


@dataclass(frozen=True)
class Failure:
    """An error as every protocol sees it: the table's status and type, what to tell the caller
    and the field at fault. The dialects in `server/dialects.py` turn it into bytes."""

    status: int
    type: str
    message: str
    param: str | None = None
    retry_after_s: float | None = None  # set when the table says a retry can succeed
    # The words Triton says it in, where its clients match them (KServe HTTP and gRPC).
    kserve_message: str | None = None


class Refused(Exception):
    """A refusal whose Failure was decided where the request was read (a large body's, off
    the event loop: server/request_bodies.py)."""

    def __init__(self, decided: Failure) -> None:
        super().__init__(decided.message)
        self.failure = decided


def as_exception(error: BaseException) -> Exception:
    """A future's error as the exception the route's dialect renders (a BaseException that is
    not an Exception, never raised by a batch, as an internal error)."""
    return error if isinstance(error, Exception) else RuntimeError(repr(error))


def failure(exc: BaseException, where: str = "") -> Failure:
    """The one table lookup: an exception (a pydantic ValidationError too) as a Failure."""
    if isinstance(exc, Refused):
        return exc.failure
    if isinstance(exc, ValidationError):
        return validation_failure(exc.errors())
    kind = next((k for cls, k in ERROR_TABLE if isinstance(exc, cls)), INTERNAL)
    if kind is INTERNAL:
        # Not in the table: a bug, not a domain error. Its traceback is what finds it, and the
        # details are in the log, not for the caller.
        logger.error("unhandled error on %s", where or "?", exc_info=exc)
        return Failure(INTERNAL.status, INTERNAL.type, "internal server error")
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    if kind.status == 500:
        # A model failed this request: said here, where the request's id is known (the batch's
        # own warning is logged outside any one request).
        logger.warning("%s answered %d: %s", where or "?", kind.status, message)
    retry_after_s = getattr(exc, "retry_after_s", 1.0) if kind.retry_after else None
    field = getattr(exc, "field", None)
    triton = getattr(exc, "kserve_message", None)
    return Failure(kind.status, kind.type, message, field, retry_after_s, triton)


def validation_failure(errors: Sequence[Any], body: Any = None) -> Failure:
    """pydantic's (or FastAPI's) first complaint about a request, naming the field: a 422."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    # An unknown key is named first: in a union, the other members' complaints about it say less.
    first = next((e for e in errors if e.get("type") == "extra_forbidden"), first)
    if first.get("type") == "json_invalid":
        param, message = _json_invalid(first, body)
    elif first.get("type") == "extra_forbidden":  # OpenAI's words; the unknown key in the path
        param = _path(first.get("loc", ()))
        return Failure(422, "invalid_request_error", unrecognized(param), param)
    else:
        param = _param_from_loc(first.get("loc", ()))
        message = str(first["msg"]).removeprefix("Value error, ")  # pydantic's, says nothing
    message = f"{param}: {message}" if param else message
    return Failure(422, "invalid_request_error", message, param)


def _path(loc: Sequence[str | int]) -> str:
    """('messages', 0, 'content', 'list[TextContentPart]', 0, 'x') -> 'messages[0].content[0].x':
    the whole path, pydantic's union tags (a type's name) dropped."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "body" and not _UNION_TAG.match(part):
            path += f".{part}" if path else part
    return path


# pydantic's names of a union's members: `list[...]`, `str`, a model's class name.
_UNION_TAG = re.compile(r"^([A-Z]\w*|\w+\[.*\]|str|int|float|bool|dict|list)$")


def unrecognized(param: str) -> str:
    return f"Unrecognized request argument supplied: {param}"


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


def _param_from_loc(loc: Sequence[str | int]) -> str | None:
    """('body', 'input_ids', 'list[int]', 3) -> 'input_ids[3]': pydantic's union tags dropped."""
    parts = [p for p in loc if p != "body"]
    if not parts:
        return None
    param = str(parts[0])
    for part in parts[1:]:
        if isinstance(part, int):
            param += f"[{part}]"
    return param
