"""What a route's declaration (route_table.py) means for one request, for HTTP and gRPC alike:
whether the API key is asked and whose it is, whether a drain refuses the request, and the
request's two metrics series."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ferry.server.auth import KeyRing
from ferry.server.drain import DrainState
from ferry.server.errors import NotReady
from ferry.server.metrics import FerryMetrics
from ferry.server.route_table import UNMATCHED, Route, RouteClass
from ferry.server.settings import Settings

SHUTTING_DOWN = "the server is shutting down"
CLIENT_GONE = 499  # the status counted for a request whose client left before its answer


class RoutePolicy:
    def __init__(self, settings: Settings, drain: DrainState) -> None:
        self._keys = KeyRing(settings.tenant_keys)
        self._drain = drain
        # Open routes of these classes still need the key where a setting says so.
        self._protected = {
            RouteClass.HEALTH: settings.api_key_protects_health,
            RouteClass.METRICS: settings.api_key_protects_metrics,
        }

    def needs_key(self, route: Route | None) -> bool:
        """Whether a key must come with the request (a path no route claims: yes, so that its
        404 says nothing to a caller without one)."""
        if not self._keys:
            return False
        if route is None or route.needs_key:
            return True
        return self._protected.get(route.kind, False)

    def tenant(self, route: Route | None, given: Callable[[], Sequence[bytes]]) -> str | None:
        """The caller's tenant, from the Authorization values `given` returns (HTTP headers or
        gRPC metadata); None where no key is asked. Raises Unauthorized or MalformedRequest."""
        if not self.needs_key(route):
            return None
        return self._keys.identify(given())

    def admit(self, route: Route | None) -> bool:
        """Whether the request is one a drain waits for (then the caller counts it in); raises
        NotReady for a new one once draining. A path no route claims is treated as work."""
        if route is not None and not route.drained:
            return False
        if self._drain.draining:
            raise NotReady(SHUTTING_DOWN)
        return True


def endpoint_label(route: Route | None) -> str:
    """The metrics' endpoint label: the route's declared path, never the request's."""
    return route.path if route is not None else UNMATCHED


def record_request(
    metrics: FerryMetrics,
    model: str,
    endpoint: str,
    status: int,
    started: float,
    trace_id: str | None = None,
) -> None:
    """Count one answered request and its duration (`started`: its time.perf_counter()); a
    sampled request's trace id is the duration's exemplar (OpenMetrics exposition), so that a
    slow bucket on a dashboard links to a trace."""
    exemplar = None if trace_id is None else {"trace_id": trace_id}
    metrics.request_answered(model, endpoint, status, time.perf_counter() - started, exemplar)
