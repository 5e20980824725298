"""The one ASGI middleware: API key, drain, body limit and request metrics, then the hot routes.

A stack of middlewares costs a coroutine frame, a `send` wrapper and a scope walk per layer per
request; on a 2-core box the event loop's CPU is taken from the cores the model needs. So every
concern that must see every request lives in this one layer, and it is the only dispatcher of
inference: /predict, /v1/embeddings, /v1/chat/completions, /v1/completions, /v1/responses and
KServe v2 infer go from here straight to their handlers (`hot.py`), streams included, without
the framework's routing, dependency solving and exception layers. The framework serves the rest
(models, health, metadata, adapters, metrics, docs) and documents the hot routes.

The handler's call into the models is one await (`route.handler(call)`); a client that leaves
cancels it, whatever it is waiting on.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferry.server.auth import KeyRing
from ferry.server.dialects import ErrorDialect, PathDialects, sse_error
from ferry.server.disconnect import CancelOnDisconnect
from ferry.server.drain import DrainState
from ferry.server.errors import (
    BodyTooLarge,
    MalformedRequest,
    NotReady,
    Unauthorized,
    UnsupportedMediaType,
    failure,
)
from ferry.server.hot import ClientGone, HotCall, HotRoute, HotRoutes, read_body
from ferry.server.image_predict import IMAGE_MEDIA
from ferry.server.metrics import FerryMetrics
from ferry.server.replies import Reply, send_reply, send_stream
from ferry.server.settings import Settings
from ferry.server.tenancy import CLAMPED_HEADER

UNMATCHED = "other"
OPEN_PATHS = frozenset({"/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc"})
PATH_CLASSES = frozenset({"predict", "v1", "v2", "health", "metrics"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
INFERENCE_HEADER = b"inference-header-content-length"  # KServe's binary tensor extension
SHUTTING_DOWN = "the server is shutting down"
# Sent to a stream still running when the drain deadline passes, so that clients see an end.
STREAM_ABORTED = sse_error(failure(NotReady(SHUTTING_DOWN))).encode()


class Gateway:
    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        metrics: FerryMetrics,
        drain: DrainState,
        hot: HotRoutes,
        dialects: PathDialects,
        state: object,
        post_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self._post_paths = post_paths  # the framework's POST routes (the hot ones are in `hot`)
        self._metrics = metrics
        self._drain = drain
        self._hot = hot
        self._dialects = dialects  # for requests that no hot route claims
        self._state = state
        self._max_body = settings.max_body_bytes
        self._keys = KeyRing(settings.tenant_keys)
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
        response = _ResponseWatch(send, state)
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
        self, scope: Scope, receive: Receive, send: _ResponseWatch, path: str, state: dict[str, Any]
    ) -> str:
        """Answer the request; returns the endpoint label."""
        matched = self._hot.match(scope["method"], path)
        route = matched[0] if matched is not None else None
        if self._keys and self._protected(path):
            given = [value for name, value in scope["headers"] if name == b"authorization"]
            try:
                state["tenant"] = self._keys.identify(given)
            except (Unauthorized, MalformedRequest) as exc:
                await self._refuse(send, exc, route, path)
                return _route_path(scope)
        if not _is_inference(path):
            await self.app(scope, receive, send)
            return _route_path(scope)
        if self._drain.draining:
            await self._refuse(send, NotReady(SHUTTING_DOWN), route, path)
            return _route_path(scope)
        task = asyncio.current_task()
        assert task is not None
        self._drain.enter(task)
        try:
            body = None
            if scope["method"] in BODY_METHODS:
                try:
                    self._check_body(scope, path, route)
                    body = await read_body(receive, self._max_body)
                except (BodyTooLarge, UnsupportedMediaType) as exc:
                    await self._refuse(send, exc, route, path)
                    return _route_path(scope)
                except ClientGone:
                    send.status = 499
                    return _route_path(scope)
            if body is None or matched is None:
                if body is not None:
                    state["raw_body"] = body  # for the framework's errors to name the field
                    receive = _replay(body, receive)
                await self.app(scope, receive, send)
                return _route_path(scope)
            call = HotCall(self._state, path, body, scope, receive, state, matched[1])
            await self._dispatch(matched[0], call, send, task)
            return matched[0].template
        except asyncio.CancelledError:
            if not self._drain.expired:
                raise
            # The drain deadline passed: finish what was started instead of a bare 500.
            task.uncancel()
            await self._abort_for_shutdown(send, route, path)
            return route.template if route is not None else _route_path(scope)
        finally:
            self._drain.leave(task)

    def _check_body(self, scope: Scope, path: str, route: HotRoute | None) -> None:
        """Refuse a body before reading it: not declared JSON where a POST is served (elsewhere
        the framework's 404 or 405 says more), or declared larger than the limit."""
        if scope["method"] == "POST" and (route is not None or path in self._post_paths):
            refused = _media_type_refusal(scope, path)
            if refused is not None:
                raise refused
        declared = _header(scope, b"content-length")
        if declared.isdigit() and int(declared) > self._max_body:
            raise BodyTooLarge(self._max_body)

    async def _dispatch(
        self, route: HotRoute, call: HotCall, send: _ResponseWatch, task: asyncio.Task[Any]
    ) -> None:
        """Run the handler and send what it returns, cancelling it if the client goes away
        (which drops its queued work or aborts its generation): one mechanism for every route."""
        gone = call.disconnected()
        cancel = CancelOnDisconnect(task)
        gone.add_done_callback(cancel)
        try:
            result = await route.handler(call)
            if isinstance(result, Reply):
                await send_reply(send, result)
            else:
                await send_stream(send, result)
        except asyncio.CancelledError:
            if not gone.done():
                raise
            task.uncancel()
            if task.cancelling():
                raise  # cancelled for another reason too (the drain deadline)
            if not send.started:
                send.status = 499  # nobody is left to read an answer
        except Exception as exc:
            if send.started:
                raise  # mid-stream: the stream writes its own error events
            await send_reply(send, route.dialect.reply(failure(exc, call.path)))
        finally:
            cancel.armed = False
            gone.remove_done_callback(cancel)
            call.close()

    def _dialect(self, route: HotRoute | None, path: str) -> ErrorDialect:
        return route.dialect if route is not None else self._dialects(path)

    async def _refuse(
        self, send: _ResponseWatch, exc: Exception, route: HotRoute | None, path: str
    ) -> None:
        await send_reply(send, self._dialect(route, path).reply(failure(exc, path)))

    def _protected(self, path: str) -> bool:
        if _is_health(path):
            return self._protect_health
        if path == "/metrics":
            return self._protect_metrics
        return path not in OPEN_PATHS

    async def _abort_for_shutdown(
        self, send: _ResponseWatch, route: HotRoute | None, path: str
    ) -> None:
        if not send.started:
            await self._refuse(send, NotReady(SHUTTING_DOWN), route, path)
        elif send.streaming and not send.finished:
            await send({"type": "http.response.body", "body": STREAM_ABORTED, "more_body": False})


class _ResponseWatch:
    """`send`, remembering the status and whether (and how) the response has begun."""

    __slots__ = ("_send", "_state", "finished", "started", "status", "streaming")

    def __init__(self, send: Send, state: dict[str, Any]) -> None:
        self._send = send
        self._state = state  # the request's: a clamped priority is said in a header
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
            clamped = self._state.get("priority_clamped")
            if clamped is not None:
                headers = [*message.get("headers", ()), (CLAMPED_HEADER, str(clamped).encode())]
                message = {**message, "headers": headers}
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
    tritonclient.http sends none with JSON-only requests, and Triton does not ask for one.
    /predict also takes an image body (image/jpeg, image/png), which needs a preflight too."""
    given = _header(scope, b"content-type").decode("latin-1")
    media = given.partition(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    if path == "/predict" and media.encode() in IMAGE_MEDIA:  # an image model's raw body
        return None
    if path.startswith("/v2/"):
        binary = media == "application/octet-stream" or _header(scope, INFERENCE_HEADER)
        if binary or not given:
            return None
        return UnsupportedMediaType(given, "application/json or application/octet-stream")
    return UnsupportedMediaType(given, "application/json")


def _header(scope: Scope, name: bytes) -> bytes:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for key, value in headers:
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
