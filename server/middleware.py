"""Pure ASGI middleware: request metrics and the body size limit (they must see every request)."""

from __future__ import annotations

import hmac
import time

from ferry.server.drain import DrainState
from ferry.server.errors import BodyTooLarge, NotReady, Unauthorized, error_response
from ferry.server.metrics import FerryMetrics
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "other"


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: FerryMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})
        started = time.perf_counter()
        status = 500
        # The endpoint is labelled by its route template only after routing; in-flight uses the path
        # class so it can be counted before.
        in_flight = self.metrics.in_flight.labels(_path_class(scope["path"]))
        in_flight.inc()

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            in_flight.dec()
            route = scope.get("route")
            endpoint = getattr(route, "path", UNMATCHED)
            model = scope["state"].get("model_name", "")
            self.metrics.requests.labels(model, endpoint, str(status)).inc()
            self.metrics.request_duration.labels(model, endpoint).observe(
                time.perf_counter() - started
            )


def _path_class(path: str) -> str:
    # A bounded label set: the first path segment only.
    head = path.split("/", 2)[1] if path.count("/") else ""
    return f"/{head}" if head in {"predict", "v1", "v2", "health", "metrics"} else UNMATCHED


class BodySizeLimitMiddleware:
    """413 for bodies over the limit, whether Content-Length says so or the stream shows it."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            response = error_response(BodyTooLarge(limit), scope["path"])
            await response(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counting_receive, send)


def _is_health(path: str) -> bool:
    return path.startswith(("/health/", "/v2/health/"))


def _is_inference(path: str) -> bool:
    return not (_is_health(path) or path == "/metrics" or path in OPEN_PATHS)


OPEN_PATHS = frozenset({"/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc"})


class ApiKeyMiddleware:
    """Bearer API key on inference endpoints; health and metrics only when configured."""

    def __init__(
        self, app: ASGIApp, api_key: str, protect_health: bool, protect_metrics: bool
    ) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()
        self._protect_health = protect_health
        self._protect_metrics = protect_metrics

    def _protected(self, path: str) -> bool:
        if _is_health(path):
            return self._protect_health
        if path == "/metrics":
            return self._protect_metrics
        return path not in OPEN_PATHS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._protected(scope["path"]):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await error_response(Unauthorized(), scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)


class DrainMiddleware:
    """Counts inference requests in flight; while draining, new ones get 503 + Retry-After."""

    def __init__(self, app: ASGIApp, drain: DrainState) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _is_inference(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            response = error_response(NotReady("the server is shutting down"), scope["path"])
            await response(scope, receive, send)
            return
        self.drain.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.leave()
