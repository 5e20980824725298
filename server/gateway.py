"""The one ASGI middleware: request id, API key, drain, body limit and request metrics, then the
hot routes.

A stack of middlewares costs a coroutine frame, a `send` wrapper and a scope walk per layer per
request; on a 2-core box the event loop's CPU is taken from the cores the model needs. So every
concern that must see every request lives in this one layer, and it is the only dispatcher of
inference: /predict, /v1/embeddings, /v1/chat/completions, /v1/completions, /v1/responses and
KServe v2 infer go from here straight to their handlers (`hot.py`), streams included, without
the framework's routing, dependency solving and exception layers. The framework serves the rest
(models, health, metadata, adapters, metrics, docs) and documents the hot routes. What each
route is (its class, key, body types and dialect) is read from `route_table.py`, and the key and
drain rules from `route_policy.py`, which the gRPC service applies too.

The handler's call into the models is one await (`route.handler(call)`); a client that leaves
cancels it, whatever it is waiting on.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferry.batcher import tracing as batcher_tracing
from ferry.server import request_ids, tracing
from ferry.server.content_encoding import (
    accepted_encoding,
    compressed,
    inflated,
    request_encoding,
)
from ferry.server.dialects import ErrorDialect, sse_error
from ferry.server.disconnect import CancelOnDisconnect
from ferry.server.errors import (
    BodyTooLarge,
    MalformedRequest,
    NotReady,
    Unauthorized,
    UnsupportedEncoding,
    UnsupportedMediaType,
    failure,
)
from ferry.server.hot import ClientGone, HotCall, HotRoute, HotRoutes, read_body
from ferry.server.replies import Reply, dumps, send_reply, send_stream
from ferry.server.route_policy import (
    CLIENT_GONE,
    SHUTTING_DOWN,
    RoutePolicy,
    endpoint_label,
    record_request,
)
from ferry.server.route_table import (
    HTTP_ROUTES,
    IN_FLIGHT_GROUPS,
    JSON,
    OCTETS,
    UNMATCHED,
    UNTYPED,
    Route,
    in_flight_group,
)
from ferry.server.routes import health, kserve_v2
from ferry.server.services import Services
from ferry.server.tenancy import CLAMPED_HEADER

if TYPE_CHECKING:
    from ferry.server.otel_tracing import ServerSpan

TRACERESPONSE = tracing.TRACERESPONSE.encode()
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Liveness answered here, not by the framework's routing and dependency solving (which the
# routes only document): idle on 2 cores, 1.45 -> 0.9 ms p50 on a bare socket. Most probes do
# not even get here: the connection's protocol answers them as they are parsed, with these
# bodies (server/inline_liveness.py); here come the rest (pipelined, traced, behind a key).
LIVENESS = {
    "/health/live": Reply(200, dumps(health.LIVE)),
    "/v2/health/live": Reply(200, dumps(kserve_v2.LIVE)),
}
# Sent to a stream still running when the drain deadline passes, so that clients see an end.
STREAM_ABORTED = sse_error(failure(NotReady(SHUTTING_DOWN))).encode()


class Gateway:
    def __init__(self, app: ASGIApp, services: Services, hot: HotRoutes) -> None:
        self.app = app
        # Read once here: each request reads an attribute of the gateway, not of the services.
        self._tracing = services.tracing  # None: tracing is off
        self._metrics = metrics = services.metrics
        self._drain = drain = services.drain
        # The key and drain rules gRPC applies too.
        self._policy = RoutePolicy(services.settings, drain)
        self._hot = hot
        self._services = services  # the hot routes'
        self._max_body = services.settings.max_body_bytes
        self._in_flight = {c: metrics.in_flight.labels(f"/{c}") for c in IN_FLIGHT_GROUPS}
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
        # Every log line of this request carries its id, and every answer (refusals too) says it.
        request_id = request_ids.from_client(_header(scope, request_ids.HEADER))
        bound = request_ids.current.set(request_id.decode("ascii"))
        server_span = None if self._tracing is None else self._server_span(scope, path, request_id)
        if server_span is not None:
            traced = batcher_tracing.current.set(server_span.request)
        # Only after routing is the endpoint known; in-flight is counted by path group before.
        in_flight = self._in_flight[in_flight_group(path)]
        self._metrics.turn_writes.add(in_flight, 1)
        response = _ResponseWatch(send, state, request_id, server_span)
        endpoint = UNMATCHED
        try:
            endpoint = await self._handle(scope, receive, response, path, state)
        finally:
            self._metrics.turn_writes.add(in_flight, -1)
            # Label values come from the route table and the configured model names only, never
            # from the request: no client can grow or break /metrics.
            model = state.get("model_name", "")
            trace_id = None
            if server_span is not None:
                trace_id = server_span.trace_id()
                finished = {"http.route": endpoint, "http.response.status_code": response.status}
                if model:
                    finished["ferry.model"] = model
                name = f"{scope['method']} {endpoint}"
                server_span.finish(name, finished, response.status >= 500)
                batcher_tracing.current.reset(traced)
            record_request(self._metrics, model, endpoint, response.status, started, trace_id)
            request_ids.current.reset(bound)

    def _server_span(self, scope: Scope, path: str, request_id: bytes) -> ServerSpan:
        """The request's SERVER span, child of the caller's W3C `traceparent` if it sent one."""
        assert self._tracing is not None
        carrier = {
            key.decode(): value.decode("latin-1")
            for key, value in scope["headers"]
            if key in tracing.TRACE_HEADER_BYTES
        }
        attributes = {
            "http.request.method": scope["method"],
            "url.path": path,
            tracing.REQUEST_ID: request_id.decode("ascii"),
        }
        return self._tracing.server_span(scope["method"], carrier, attributes)

    async def _handle(
        self, scope: Scope, receive: Receive, send: _ResponseWatch, path: str, state: dict[str, Any]
    ) -> str:
        """Answer the request; returns the endpoint label."""
        declared = HTTP_ROUTES.find(path)  # its class, key and body rules
        matched = self._hot.match(scope["method"], path)
        route = matched[0] if matched is not None else None
        try:
            tenant = self._policy.tenant(declared, lambda: _headers(scope, b"authorization"))
            if tenant is not None:
                state["tenant"] = tenant
            counted = self._policy.admit(declared)
        except (Unauthorized, MalformedRequest, NotReady) as exc:
            await self._refuse(send, exc, route, path)
            return _route_path(scope)
        if not counted:
            live = LIVENESS.get(path) if scope["method"] == "GET" else None
            if live is None:
                await self.app(scope, receive, send)
                return _route_path(scope)
            await send_reply(send, live)
            return endpoint_label(declared)
        task = asyncio.current_task()
        assert task is not None
        self._drain.enter(task)
        try:
            body = None
            if scope["method"] in BODY_METHODS:
                try:
                    self._check_body(scope, declared)
                    encoding = request_encoding(_header(scope, b"content-encoding"))
                    body = await read_body(receive, self._max_body)
                    if encoding is not None:
                        body = await inflated(body, encoding, self._max_body)
                except (
                    BodyTooLarge,
                    UnsupportedMediaType,
                    UnsupportedEncoding,
                    MalformedRequest,
                ) as exc:
                    await self._refuse(send, exc, route, path)
                    return _route_path(scope)
                except ClientGone:
                    send.status = CLIENT_GONE
                    return _route_path(scope)
            if body is None or matched is None:
                if body is not None:
                    state["raw_body"] = body  # for the framework's errors to name the field
                    receive = _replay(body, receive)
                await self.app(scope, receive, send)
                return _route_path(scope)
            call = HotCall(self._services, path, body, scope, receive, state, matched[1])
            await self._dispatch(matched[0], call, send, task)
            return endpoint_label(declared)  # the hot route's declared path, as gRPC's
        except asyncio.CancelledError:
            if not self._drain.expired:
                raise
            # The drain deadline passed: finish what was started instead of a bare 500.
            task.uncancel()
            await self._abort_for_shutdown(send, route, path)
            return endpoint_label(declared) if route is not None else _route_path(scope)
        finally:
            self._drain.leave(task)

    def _check_body(self, scope: Scope, declared: Route | None) -> None:
        """Refuse a body before reading it: not of a media type the route takes where a POST is
        served (elsewhere the framework's 404 or 405 says more), or declared over the limit."""
        if declared is not None and scope["method"] in declared.methods and declared.media:
            refused = _media_type_refusal(scope, declared.media)
            if refused is not None:
                raise refused
        length = _header(scope, b"content-length")
        if length.isdigit() and int(length) > self._max_body:
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
            with tracing.span("ferry.response"):
                if isinstance(result, Reply):
                    await send_reply(send, await _encoded(route, call, result))
                else:
                    await send_stream(send, result)
        except asyncio.CancelledError:
            if not gone.done():
                raise
            task.uncancel()
            if task.cancelling():
                raise  # cancelled for another reason too (the drain deadline)
            if not send.started:
                send.status = CLIENT_GONE  # nobody is left to read an answer
        except Exception as exc:
            if send.started:
                raise  # mid-stream: the stream writes its own error events
            await send_reply(send, route.dialect.reply(failure(exc, call.path)))
        finally:
            cancel.armed = False
            gone.remove_done_callback(cancel)
            call.close()

    def _dialect(self, route: HotRoute | None, path: str) -> ErrorDialect:
        return route.dialect if route is not None else HTTP_ROUTES.dialect_of(path)

    async def _refuse(
        self, send: _ResponseWatch, exc: Exception, route: HotRoute | None, path: str
    ) -> None:
        await send_reply(send, self._dialect(route, path).reply(failure(exc, path)))

    async def _abort_for_shutdown(
        self, send: _ResponseWatch, route: HotRoute | None, path: str
    ) -> None:
        if not send.started:
            await self._refuse(send, NotReady(SHUTTING_DOWN), route, path)
        elif send.streaming and not send.finished:
            await send({"type": "http.response.body", "body": STREAM_ABORTED, "more_body": False})


class _ResponseWatch:
    """`send`, remembering the status and whether (and how) the response has begun, and adding
    the request id's header (and a clamped priority's) to the response's."""

    __slots__ = ("_headers", "_send", "_state", "finished", "started", "status", "streaming")

    def __init__(
        self, send: Send, state: dict[str, Any], request_id: bytes, span: ServerSpan | None
    ) -> None:
        self._send = send
        self._state = state  # the request's: a clamped priority is said in a header
        # Added to the answer's: the request id, and the server span's context when traced.
        self._headers = [(request_ids.HEADER, request_id)]
        if span is not None:
            self._headers.append((TRACERESPONSE, span.traceresponse().encode()))
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
            headers = [*message.get("headers", ()), *self._headers]
            clamped = self._state.get("priority_clamped")
            if clamped is not None:
                headers.append((CLAMPED_HEADER, str(clamped).encode()))
            message = {**message, "headers": headers}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self._send(message)


async def _encoded(route: HotRoute, call: HotCall, reply: Reply) -> Reply:
    """`reply` compressed where the route compresses and the client accepts it."""
    accepted = call.header(b"accept-encoding") if route.compress else None
    encoding = accepted_encoding(accepted) if accepted else None
    return reply if encoding is None else await compressed(reply, encoding)


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


def _media_type_refusal(scope: Scope, accepted: tuple[str, ...]) -> UnsupportedMediaType | None:
    content_type = _header(scope, b"content-type")
    return media_type_refusal(
        content_type, bool(_header(scope, kserve_v2.HEADER_LENGTH_KEY)), accepted
    )


def media_type_refusal(
    content_type: bytes, binary_header: bool, accepted: tuple[str, ...]
) -> UnsupportedMediaType | None:
    """415 unless the body is of a type the route takes (route_table.py), before it is read.
    A form, text/plain or no type at all is what a page on another origin can post without a
    CORS preflight, so JSON routes take JSON only. KServe's infer also takes binary tensors
    (application/octet-stream, or Triton's header whatever the type: `binary_header`) and no
    type: tritonclient.http sends none with JSON-only requests, and Triton does not ask for one."""
    given = content_type.decode("latin-1")
    media = given.partition(";")[0].strip().lower()
    if JSON in accepted and (media == JSON or media.endswith("+json")):
        return None
    if media and media in accepted:
        return None
    if OCTETS in accepted and binary_header:
        return None
    if not given and UNTYPED in accepted:
        return None
    return UnsupportedMediaType(given, " or ".join(t for t in accepted if t))


def _header(scope: Scope, name: bytes) -> bytes:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for key, value in headers:
        if key == name:
            return value
    return b""


def _headers(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of a header (a repeated Authorization header is refused, not picked from)."""
    return [value for key, value in scope["headers"] if key == name]


def _route_path(scope: Scope) -> str:
    return getattr(scope.get("route"), "path", UNMATCHED)


__all__ = ["Gateway", "media_type_refusal"]
