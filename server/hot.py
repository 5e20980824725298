"""Hot routes: inference handlers that take the body's bytes and return a reply's bytes.

A handler is `async (HotCall) -> Reply` and raises the domain's exceptions (rendered through the
one error table). The gateway calls it straight from ASGI; `as_route` adapts it to a framework
route so the same handler is also what the OpenAPI schema documents.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ferry.server.connection_limits import DISCONNECTED
from ferry.server.errors import BodyTooLarge, error_parts

JSON = b"application/json"


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: bytes = JSON
    headers: tuple[tuple[bytes, bytes], ...] = ()


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, dumps(value))


def dumps(value: Any) -> bytes:
    """JSON bytes: numpy arrays written directly (float32 in its shortest form)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=_fallback)
    except TypeError:
        # Text orjson refuses (a lone surrogate echoed from a request) still gets an answer.
        import json

        return json.dumps(value, default=_fallback, ensure_ascii=True).encode()


def _fallback(value: Any) -> Any:
    if hasattr(value, "tolist"):  # non-contiguous arrays and numpy scalars
        return value.tolist()
    raise TypeError(f"cannot encode {type(value).__name__}")


def error_reply(exc: BaseException, path: str) -> Reply:
    status, body, headers = error_parts(exc, path)
    return Reply(
        status,
        dumps(body),
        headers=tuple((k.lower().encode(), v.encode()) for k, v in headers.items()),
    )


@dataclass
class HotCall:
    """One request to a hot route: its body, path and a way to learn that the client left."""

    app_state: Any
    path: str
    body: bytes
    scope: Scope
    receive: Receive
    # The request's state (the framework's `request.state`): the route sets `model_name`.
    state: dict
    _watcher: asyncio.Task | None = field(default=None, repr=False)

    def path_param(self, pattern: re.Pattern[str], name: str) -> str:
        match = pattern.fullmatch(self.path)
        assert match is not None, "the route matched this path"
        return match.group(name)

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.scope["headers"]:
            if key == name:
                return value
        return None

    def disconnected(self) -> asyncio.Future:
        """Resolves when the client goes away (the body is read: only that can arrive now)."""
        given = self.scope.get("extensions", {}).get(DISCONNECTED)
        if given is not None:
            return given  # set by Ferry's HTTP protocol: no listening task needed
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(_until_disconnect(self.receive))
        return self._watcher

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


Handler = Callable[[HotCall], Awaitable[Reply]]


@dataclass(frozen=True)
class HotRoute:
    method: str
    template: str  # the route's path as the framework writes it: the metrics' endpoint label
    pattern: re.Pattern[str]
    handler: Handler


class HotRoutes:
    def __init__(self) -> None:
        self._exact: dict[tuple[str, str], HotRoute] = {}
        self._patterns: list[HotRoute] = []

    def add(self, method: str, template: str, handler: Handler) -> HotRoute:
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
        route = HotRoute(method, template, re.compile(regex), handler)
        if "{" in template:
            self._patterns.append(route)
        else:
            self._exact[(method, template)] = route
        return route

    def match(self, method: str, path: str) -> HotRoute | None:
        route = self._exact.get((method, path))
        if route is not None:
            return route
        for candidate in self._patterns:
            if candidate.method == method and candidate.pattern.fullmatch(path):
                return candidate
        return None


def register_post(
    router: Any,
    hot: HotRoutes,
    path: str,
    handler: Handler,
    *,
    summary: str,
    responses: dict[int | str, dict[str, Any]],
    body_model: type[Any] | None = None,
    response_model: type[Any] | None = None,
    include_in_schema: bool = True,
    tags: list[str] | None = None,
) -> None:
    """A hot POST route, also registered with the framework so the OpenAPI schema has it."""
    route = hot.add("POST", path, handler)
    # The endpoint takes the raw request, so the schema's parameters and body are given here.
    extra: dict[str, Any] = request_body(body_model) if body_model is not None else {}
    params = route.pattern.groupindex
    if params:
        extra["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in params
        ]
    router.add_api_route(
        path,
        as_route(route),
        methods=["POST"],
        response_model=response_model,
        responses=responses,
        openapi_extra=extra or None,
        include_in_schema=include_in_schema,
        summary=summary,
        # One per path: the versioned KServe route shares its handler with the plain one.
        operation_id=re.sub(r"\W+", "_", f"{summary} {path}").strip("_").lower(),
        tags=tags,
    )


def as_route(route: HotRoute) -> Callable[[Request], Awaitable[Response]]:
    """The framework's endpoint for a hot route (reached only without the gateway in front)."""

    async def endpoint(request: Request) -> Response:
        call = HotCall(
            request.app.state,
            request.url.path,
            await request.body(),
            request.scope,
            request.receive,
            request.scope.setdefault("state", {}),
        )
        try:
            reply = await route.handler(call)
        except Exception as exc:
            reply = error_reply(exc, call.path)
        finally:
            call.close()
        headers = {k.decode(): v.decode() for k, v in reply.headers}
        return Response(reply.body, reply.status, headers, media_type=reply.content_type.decode())

    return endpoint


def request_body(model: type[Any]) -> dict[str, Any]:
    """The OpenAPI requestBody of a hot route, from the same pydantic model it parses with."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as it passes `limit` (chunked bodies too)."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_reply(send: Send | Callable[[Message], Awaitable[None]], reply: Reply) -> None:
    headers = [
        (b"content-type", reply.content_type),
        (b"content-length", str(len(reply.body)).encode()),
        *reply.headers,
    ]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})
