"""The one ASGI middleware: API key, drain, body limit and request metrics, then the hot routes.

A stack of middlewares costs a coroutine frame, a `send` wrapper and a scope walk per layer per
request; on a 2-core box the event loop's CPU is taken from the cores the model needs. So every
concern that must see every request lives in this one layer, and the inference routes
(/predict, /v1/embeddings, KServe v2 infer) are dispatched from here straight to their handlers,
without the framework's routing, dependency solving and exception layers. The same handlers
back the framework's routes (`hot.as_route`), which keeps them in the OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferry.server.auth import check_bearer
from ferry.server.drain import DrainState
from ferry.server.errors import (
    BodyTooLarge,
    MalformedRequest,
    NotReady,
    Unauthorized,
    UnsupportedMediaType,
)
from ferry.server.hot import (
    ClientGone,
    HotCall,
    HotRoutes,
    error_reply,
    read_body,
    send_reply,
)
from ferry.server.metrics import FerryMetrics
from ferry.server.settings import Settings

UNMATCHED = "other"
OPEN_PATHS = frozenset({"/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc"})
PATH_CLASSES = frozenset({"predict", "v1", "v2", "health", "metrics"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
INFERENCE_HEADER = b"inference-header-content-length"  # KServe's binary tensor extension
# Sent to a stream still running when the drain deadline passes, so that clients see an end.
STREAM_ABORTED = (
    b'data: {"error": {"message": "the server is shutting down", "type": "unavailable_error",'
    b' "param": null, "code": 503}}\n\ndata: [DONE]\n\n'
)


class Gateway:
    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        metrics: FerryMetrics,
        drain: DrainState,
        hot: HotRoutes,
        state: object,
        post_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self._post_paths = post_paths  # the framework's POST routes (the hot ones are in `hot`)
        self._metrics = metrics
        self._drain = drain
        self._hot = hot
        self._state = state
        self._max_body = settings.max_body_bytes
        self._key = settings.api_key.encode() if settings.api_key else None
        self._protect_health = settings.api_key_protects_health
        self._protect_metrics = settings.api_key_protects_metrics
        self._in_flight = {c: metrics.in_flight.labels(f"/{c}") for c in PATH_CLASSES}
        self._in_flight[UNMATCHED] = metrics.in_flight.labels(UNMATCHED)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        if scope["method"] == "HEAD":
            # HEAD answered as GET (probes such as aiperf's send HEAD first); uvicorn still holds
            # the original scope and so sends the headers only.
            scope = {**scope, "method": "GET"}
        path: str = scope["path"]
        state = scope.setdefault("state", {})
        # Only after routing is the endpoint known; in-flight is counted by path class before.
        in_flight = self._in_flight[_path_class(path)]
        in_flight.inc()
        response = _ResponseWatch(send)
        endpoint = UNMATCHED
        try:
            endpoint = await self._handle(scope, receive, response, path, state)
        finally:
            in_flight.dec()
            # Label values come from the route table and the configured model names only, never
            # from the request: no client can grow or break /metrics.
            model = state.get("model_name", "")
            self._metrics.requests.labels(model, endpoint, str(response.status)).inc()
            self._metrics.request_duration.labels(model, endpoint).observe(
                time.perf_counter() - started
            )

    async def _handle(
        self, scope: Scope, receive: Receive, send: _ResponseWatch, path: str, state: dict
    ) -> str:
        """Answer the request; returns the endpoint label."""
        if self._key is not None and self._protected(path):
            given = [value for name, value in scope["headers"] if name == b"authorization"]
            try:
                check_bearer(given, self._key)
            except (Unauthorized, MalformedRequest) as exc:
                await send_reply(send, error_reply(exc, path))
                return _route_path(scope)
        inference = _is_inference(path)
        if not inference:
            await self.app(scope, receive, send)
            return _route_path(scope)
        if self._drain.draining:
            await send_reply(send, error_reply(NotReady("the server is shutting down"), path))
            return _route_path(scope)
        self._drain.enter()
        try:
            return await self._inference(scope, receive, send, path, state)
        except asyncio.CancelledError:
            if not self._drain.expired:
                raise
            # The drain deadline passed: finish what was started instead of a bare 500.
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            await self._abort_for_shutdown(send, path)
            return _route_path(scope)
        finally:
            self._drain.leave()

    async def _inference(
        self, scope: Scope, receive: Receive, send: _ResponseWatch, path: str, state: dict
    ) -> str:
        method = scope["method"]
        body: bytes | None = None
        if method in BODY_METHODS:
            # Only where a POST is served: elsewhere the framework's 404 or 405 says more.
            posts = method == "POST" and (
                path in self._post_paths or self._hot.match(method, path) is not None
            )
            refused = _media_type_refusal(scope, path) if posts else None
            if refused is not None:
                await send_reply(send, error_reply(refused, path))
                return _route_path(scope)
            try:
                declared = _header(scope, b"content-length")
                if declared.isdigit() and int(declared) > self._max_body:
                    raise BodyTooLarge(self._max_body)
                body = await read_body(receive, self._max_body)
            except BodyTooLarge as exc:
                await send_reply(send, error_reply(exc, path))
                return _route_path(scope)
            except ClientGone:
                send.status = 499
                return _route_path(scope)
        route = self._hot.match(method, path) if body is not None else None
        if route is None:
            if body is not None:
                state["raw_body"] = body  # for errors.py to name the field of a bad body
            await self.app(scope, _replay(body, receive) if body is not None else receive, send)
            return _route_path(scope)
        call = HotCall(self._state, path, body or b"", scope, receive, state)
        try:
            reply = await route.handler(call)
        except Exception as exc:
            reply = error_reply(exc, path)
        finally:
            call.close()
        await send_reply(send, reply)
        return route.template

    def _protected(self, path: str) -> bool:
        if _is_health(path):
            return self._protect_health
        if path == "/metrics":
            return self._protect_metrics
        return path not in OPEN_PATHS

    async def _abort_for_shutdown(self, send: _ResponseWatch, path: str) -> None:
        if not send.started:
            await send_reply(send, error_reply(NotReady("the server is shutting down"), path))
        elif send.streaming and not send.finished:
            await send({"type": "http.response.body", "body": STREAM_ABORTED, "more_body": False})


class _ResponseWatch:
    """`send`, remembering the status and whether (and how) the response has begun."""

    __slots__ = ("_send", "finished", "started", "status", "streaming")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 500
        self.started = False
        self.streaming = False
        self.finished = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.started = True
            self.streaming = any(
                name == b"content-type" and value.startswith(b"text/event-stream")
                for name, value in message.get("headers", ())
            )
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self._send(message)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the framework the body already read, then the client's events."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _media_type_refusal(scope: Scope, path: str) -> UnsupportedMediaType | None:
    """415 unless the body is declared JSON, before it is read. A form, text/plain or no type
    at all is what a page on another origin can post without a CORS preflight. KServe's infer
    also takes binary tensors (application/octet-stream, or Triton's header) and no type:
    tritonclient.http sends none with JSON-only requests, and Triton does not ask for one."""
    given = _header(scope, b"content-type").decode("latin-1")
    media = given.partition(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    if path.startswith("/v2/"):
        binary = media == "application/octet-stream" or _header(scope, INFERENCE_HEADER)
        if binary or not given:
            return None
        return UnsupportedMediaType(given, "application/json or application/octet-stream")
    return UnsupportedMediaType(given, "application/json")


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return b""


def _route_path(scope: Scope) -> str:
    return getattr(scope.get("route"), "path", UNMATCHED)


def _path_class(path: str) -> str:
    # A bounded label set: the first path segment only.
    head = path.split("/", 2)[1] if path.count("/") else ""
    return head if head in PATH_CLASSES else UNMATCHED


def _is_health(path: str) -> bool:
    return path.startswith(("/health/", "/v2/health/"))


def _is_inference(path: str) -> bool:
    return not (_is_health(path) or path == "/metrics" or path in OPEN_PATHS)


__all__ = ["Gateway"]
