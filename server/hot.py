"""Hot routes: the inference handlers the gateway dispatches, straight from ASGI.

A handler is `async (HotCall) -> Reply | Stream` and raises the domain's exceptions; the route
carries the error dialect they are rendered in. Which routes are hot, and their dialects, is
declared in `route_table.py` (the INFERENCE class); `register` takes nothing else. The framework
only documents these routes: its endpoint for them is never reached, since the gateway answers
first.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope

from ferry.server.dialects import ErrorDialect
from ferry.server.disconnect import disconnect_future
from ferry.server.errors import BodyTooLarge
from ferry.server.replies import Reply, Stream
from ferry.server.route_table import HTTP_ROUTES, RouteClass

if TYPE_CHECKING:
    from ferry.server.services import Services

NO_PARAMS: Mapping[str, str] = MappingProxyType({})


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


@dataclass
class HotCall:
    """One request to a hot route: its body, path parameters and a way to learn that the client
    left."""

    services: Services
    path: str
    body: bytes
    scope: Scope
    receive: Receive
    # The request's state (the framework's `request.state`): the route sets `model_name`.
    state: dict[str, Any]
    params: Mapping[str, str]  # the route template's `{name}`s, from its match
    _gone: asyncio.Future[None] | None = field(default=None, repr=False)
    _watcher: asyncio.Task[None] | None = field(default=None, repr=False)

    def header(self, name: bytes) -> bytes | None:
        headers: list[tuple[bytes, bytes]] = self.scope["headers"]
        for key, value in headers:
            if key == name:
                return value
        return None

    def disconnected(self) -> asyncio.Future[None]:
        """The request's one disconnect future (see `disconnect.py`)."""
        if self._gone is None:
            self._gone, self._watcher = disconnect_future(self.scope, self.receive)
        return self._gone

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()


Handler = Callable[[HotCall], Awaitable[Reply | Stream]]


@dataclass(frozen=True)
class HotRoute:
    method: str
    template: str  # the route's path as the framework and route_table.py write it
    pattern: re.Pattern[str]
    handler: Handler
    dialect: ErrorDialect  # how this route's errors are written
    compress: bool = False  # answers compressed when the client accepts it (route_table.py)


class HotRoutes:
    def __init__(self) -> None:
        self._exact: dict[tuple[str, str], HotRoute] = {}
        self._patterns: list[HotRoute] = []

    def add(
        self,
        method: str,
        template: str,
        handler: Handler,
        dialect: ErrorDialect,
        compress: bool = False,
    ) -> HotRoute:
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
        route = HotRoute(method, template, re.compile(regex), handler, dialect, compress)
        if "{" in template:
            self._patterns.append(route)
        else:
            self._exact[(method, template)] = route
        return route

    def match(self, method: str, path: str) -> tuple[HotRoute, Mapping[str, str]] | None:
        """The route and its path parameters."""
        route = self._exact.get((method, path))
        if route is not None:
            return route, NO_PARAMS
        for candidate in self._patterns:
            if candidate.method == method:
                found = candidate.pattern.fullmatch(path)
                if found is not None:
                    return candidate, found.groupdict()
        return None


def register(
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
    """A hot POST route, in the dialect the route table declares for it, and its entry in the
    framework's router for the OpenAPI schema (and the 405 a GET gets)."""
    declared = HTTP_ROUTES.find(path)
    if (
        declared is None
        or declared.path != path
        or declared.kind is not RouteClass.INFERENCE
        or "POST" not in declared.methods
    ):
        raise ValueError(f"{path} is not declared an inference route in route_table.py")
    route = hot.add("POST", path, handler, declared.dialect, declared.compress)
    router.add_api_route(
        path,
        _documentation(body_model, list(route.pattern.groupindex)),
        methods=["POST"],
        response_model=response_model,
        responses=responses,
        include_in_schema=include_in_schema,
        summary=summary,
        # One per path: the versioned KServe route shares its handler with the plain one.
        operation_id=re.sub(r"\W+", "_", f"{summary} {path}").strip("_").lower(),
        tags=tags,
    )


def _documentation(body_model: type[Any] | None, params: list[str]) -> Callable[..., Any]:
    """An endpoint whose signature documents the route (its path parameters and body model);
    the gateway serves every request to it, so calling it is a bug."""

    async def served_by_gateway(**_: Any) -> None:
        raise AssertionError("hot routes are served by the gateway")

    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.Parameter(name, keyword, annotation=str) for name in params]
    if body_model is not None:
        parameters.append(inspect.Parameter("body", keyword, annotation=body_model))
    served_by_gateway.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]  # read by FastAPI
    return served_by_gateway


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
