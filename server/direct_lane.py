"""KServe v2 inference served from the connection's protocol: the request read, checked and
queued in the callback that parsed it, its answer written from its batch's completion. No ASGI
cycle, gateway task or coroutine per request.

Why: on a fast model nearly all of a request's time is Python, spread thin (docs/benchmarks.md:
81 % of the server's CPU in the interpreter, no function above 3 %). In one process alternating
the two ways every 5 s (wrk, 64 clients, a one-row gradient-boosting model), a prototype of this
lane served 1.69x the requests of the gateway's path.

A request takes the lane only where the gateway would do nothing but hand it to the KServe infer
handler: a POST to the infer route over HTTP/1.1 keep-alive, its connection owing no earlier
answer, a body of at most LARGE_BODY_BYTES of a media type the route takes (JSON, or Triton's
binary tensors), no header the gateway acts on itself (encodings, a compressed answer asked for,
an Origin for CORS), with tracing off, no API keys and no drain. The handler's own steps are
kserve/queued_infer.py's, which gives a request back where the handler would suspend. What it
raises is answered as the gateway answers a hot route's exception (the route's dialect), with
the same request id header and metrics; a client that leaves has its queued rows dropped and is
counted 499. A plain request to a graph whose rows stack is queued with the rest of its loop
turn's (kserve/turn_groups.py); a group's rows are dropped once every member's client has left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from ferry.server import request_ids
from ferry.server.content_encoding import accepted_encoding
from ferry.server.errors import as_exception, failure
from ferry.server.gateway import media_type_refusal
from ferry.server.hot import HotRoute, HotRoutes
from ferry.server.kserve.lookup import find_model
from ferry.server.kserve.queued_infer import QueuedInfer, Results, queued_infer
from ferry.server.kserve.turn_groups import Member, TurnGroups
from ferry.server.large_bodies import LARGE_BODY_BYTES
from ferry.server.replies import Reply, header_lines
from ferry.server.response_size import written
from ferry.server.route_policy import CLIENT_GONE, RoutePolicy, record_request
from ferry.server.route_table import HTTP_ROUTES, in_flight_group
from ferry.server.routes import kserve_v2
from ferry.server.services import Services

Headers = Iterable[tuple[bytes, bytes]]
# Headers the gateway acts on itself: a request sending any goes its way (and one accepting an
# answer compressed in a coding the gateway writes, or of a media type it refuses).
ACTED_ON = frozenset({b"content-encoding", b"transfer-encoding", b"expect", b"origin"})
MAX_REMEMBERED = 4096  # URLs and media types remembered, whatever clients send


class _NoEvent:
    def set(self) -> None:
        pass


class Connection(Protocol):
    """What the lane needs of the connection a request came on (server/connection_limits.py)."""

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        """uvicorn's, at the head of every answer: date and server."""
        ...

    def answer_direct(self, cycle: DirectCycle, data: bytes) -> None:
        """Write a whole answer and finish the request (closing if not kept alive)."""
        ...


class DirectCycle:
    """Stands where uvicorn's request cycle would for a request the lane serves: uvicorn and the
    connection guards read these attributes, and `shutdown` clears `keep_alive`."""

    __slots__ = (
        "disconnected",
        "keep_alive",
        "on_gone",
        "response_complete",
        "response_started",
        "scope",
    )
    # uvicorn sets a cycle's event when its connection is lost; nothing waits on this one.
    message_event = _NoEvent()

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.scope = {"headers": headers}  # for the guards' request id
        self.keep_alive = True
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        # What runs when the client leaves first (set while the request waits for its batch).
        self.on_gone: Callable[[], None] | None = None

    def client_left(self) -> None:
        if not self.response_complete and self.on_gone is not None:
            self.on_gone()


class Taken(NamedTuple):
    """A request the lane takes, as read from its head."""

    route: HotRoute
    path: str
    model: str
    version: str | None
    media: tuple[str, ...]  # the body's media types the route takes (route_table.py)
    request_id: bytes = b""  # the client's, safe to log; b"": each request is given its own
    header_length: str | None = None  # Triton's binary tensors: the JSON header's length


class DirectLane:
    def __init__(self, services: Services, hot: HotRoutes) -> None:
        self._services = services
        self._hot = hot
        self._metrics = services.metrics
        self._drain = services.drain
        self._in_flight = services.metrics.in_flight.labels(f"/{in_flight_group('/v2/')}")
        self._body_limit = min(LARGE_BODY_BYTES, services.settings.max_body_bytes)
        self._urls: dict[bytes, Taken | None] = {}
        self._media: dict[tuple[bytes, bool, tuple[str, ...]], bool] = {}
        # uvicorn's default headers (date, server: a new list each second) as a head's lines.
        self._defaults: tuple[list[tuple[bytes, bytes]], bytes] = ([], b"")
        self._groups = TurnGroups(services, self._queued_alone)

    @property
    def body_limit(self) -> int:
        """A longer body goes to the gateway (large ones are read off the loop there)."""
        return self._body_limit

    def takes(self, method: bytes, url: bytes, headers: Headers) -> Taken | None:
        """The request, from its head, where the lane serves it; None: the gateway's."""
        if method != b"POST" or self._drain.draining:
            return None
        route = self._route(url)
        if route is None:
            return None
        request_id = content_type = header_length = None
        for name, value in headers:  # the first of each, as the gateway reads them
            if name in ACTED_ON:
                return None
            if name == b"accept-encoding" and accepted_encoding(value) is not None:
                return None
            if name == request_ids.HEADER and request_id is None:
                request_id = value
            elif name == b"content-type" and content_type is None:
                content_type = value
            elif name == kserve_v2.HEADER_LENGTH_KEY and header_length is None:
                header_length = value
        if self._refused(content_type or b"", bool(header_length), route.media):
            return None
        return Taken(
            route.route,
            route.path,
            route.model,
            route.version,
            route.media,
            request_ids.safe(request_id or b""),
            header_length.decode("latin-1") if header_length else None,
        )

    def retakes(self, taken: Taken) -> Taken | None:
        """A request whose head is byte for byte that of `taken` (the connection's last,
        server/repeated_heads.py), as `takes` would read it now."""
        return None if self._drain.draining else taken

    def _refused(self, content_type: bytes, binary_header: bool, media: tuple[str, ...]) -> bool:
        """Whether the route refuses the body's media type (gateway.media_type_refusal),
        remembered: clients send one or two content types."""
        key = (content_type, binary_header, media)
        refused = self._media.get(key)
        if refused is None:
            refused = media_type_refusal(content_type, binary_header, media) is not None
            if len(self._media) < MAX_REMEMBERED:  # bounded whatever clients send
                self._media[key] = refused
        return refused

    def start(
        self, taken: Taken, headers: list[tuple[bytes, bytes]], body: bytes, connection: Connection
    ) -> DirectCycle | None:
        """The request served (queued, or answered at once); None: the gateway's after all."""
        started = time.perf_counter()
        cycle = DirectCycle(headers)
        model = ""
        try:
            services = self._services
            found = find_model(services.registry, services.encoder, taken.model, taken.version)
            model = found.name
            member = None if taken.header_length else self._groups.read(found, body)
            if member is None:
                queued = queued_infer(services, found, body, taken.header_length)
            else:  # queued with the rest of this loop turn's (kserve/turn_groups.py)
                queued = QueuedInfer(model, [], self._groups.answer_of(member))
        except Exception as exc:  # answered as the gateway answers a handler's
            self._finish(connection, cycle, taken, model, started, exc)
            return cycle
        if queued is None:
            return None
        self._metrics.turn_writes.add(self._in_flight, 1)
        self._drain.count_in()
        waiting = _Waiting(self, connection, cycle, taken, queued, started, member)
        cycle.on_gone = waiting.drop
        if member is not None:
            self._groups.join(member, waiting)
        for future in queued.futures:
            future.add_done_callback(waiting.done)
        return cycle

    def _queued_alone(self, member: Member) -> QueuedInfer:
        """A group's member queued by itself, the general way."""
        queued = queued_infer(self._services, member.model, member.body)
        if queued is None:  # group_plan admits only what queued_infer serves
            raise RuntimeError("a plain request the lane could not queue")
        return queued

    def _route(self, url: bytes) -> Taken | None:
        """The infer route `url` is for (its request id not read yet), remembered by URL: a
        request's path is matched against every hot route's pattern otherwise."""
        if url in self._urls:
            return self._urls[url]
        taken = None
        if b"?" not in url and b"%" not in url:  # else the framework's reading of the path
            path = url.decode("latin-1")
            matched = self._hot.match("POST", path)
            declared = HTTP_ROUTES.find(path)
            if (
                matched is not None
                and declared is not None
                and matched[0].handler is kserve_v2.infer
            ):
                params = matched[1]
                name, version = params["name"], params.get("version")
                taken = Taken(matched[0], path, name, version, declared.media)
        if len(self._urls) < MAX_REMEMBERED:  # bounded whatever clients send
            self._urls[url] = taken
        return taken

    def _finish(
        self,
        connection: Connection,
        cycle: DirectCycle,
        taken: Taken,
        model: str,
        started: float,
        outcome: Reply | Exception,
    ) -> None:
        """Answer (a reply, or an exception in the route's dialect, as the gateway renders a
        hot route's), count, and free the connection."""
        request_id = taken.request_id or request_ids.new_id()
        if isinstance(outcome, Reply):
            reply = outcome
        else:
            bound = request_ids.current.set(request_id.decode("ascii"))  # for failure()'s log
            try:
                reply = taken.route.dialect.reply(failure(outcome, taken.path))
            finally:
                request_ids.current.reset(bound)
        # The head as uvicorn writes the gateway's (send_reply's headers, then the request
        # id), every byte of it Ferry's own: no header check needed.
        defaults, lines = self._defaults
        if connection.default_headers is not defaults:
            defaults = connection.default_headers
            lines = b"".join(b"%s: %s\r\n" % pair for pair in defaults)
            self._defaults = (defaults, lines)
        head = [STATUS_LINE[reply.status], lines, header_lines(reply)]
        head.append(b"%s: %s\r\n" % (request_ids.HEADER, request_id))
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        cycle.response_started = True
        connection.answer_direct(cycle, b"".join(head) + reply.body)
        record_request(self._metrics, model, taken.route.template, reply.status, started)

    def _left(self, cycle: DirectCycle, taken: Taken, model: str, started: float) -> None:
        cycle.response_complete = True
        record_request(self._metrics, model, taken.route.template, CLIENT_GONE, started)

    def _settled(self) -> None:
        self._metrics.turn_writes.add(self._in_flight, -1)
        self._drain.count_out()


@dataclass(slots=True, eq=False)
class _Waiting:
    """A queued request: its chunks' futures, until all are done, one fails, or the client
    leaves (its rows then dropped from the queue, as gather_results drops them)."""

    _lane: DirectLane
    _connection: Connection
    _cycle: DirectCycle
    _taken: Taken
    _queued: QueuedInfer
    _started: float
    _member: Member | None = None  # its group's, where it joined one
    _settled: bool = False

    def requeue(self, queued: QueuedInfer) -> None:
        """Wait for `queued` instead (a group's member queued alone)."""
        self._queued = queued
        for future in queued.futures:
            future.add_done_callback(self.done)

    def done(self, future: asyncio.Future[Any]) -> None:
        if self._settled:
            return
        if future.cancelled():  # never by the lane while waiting: someone else's doing
            self.end(RuntimeError("the request's queued work was cancelled"))
            return
        error = future.exception()
        if error is not None:
            self.end(as_exception(error))
            return
        futures = self._queued.futures
        if len(futures) == 1 or all(f.done() for f in futures):
            self.answer([f.result() for f in futures])

    def drop(self) -> None:
        if self._settled:
            return
        self._settle()
        self._lane._left(self._cycle, self._taken, self._queued.model, self._started)

    def answer(self, results: Results) -> None:
        try:
            size, write = self._queued.answer(results)
            if size >= LARGE_BODY_BYTES:  # rendered off the loop, as the handler's `written`
                rendering = asyncio.ensure_future(written(size, write))
                rendering.add_done_callback(self._rendered)
                return
            self.end(write())
        except Exception as exc:  # the gateway answers a handler's the same
            self.end(exc)

    def _rendered(self, rendering: asyncio.Future[Reply]) -> None:
        if self._settled:
            return
        error = rendering.exception()
        self.end(rendering.result() if error is None else as_exception(error))

    def end(self, outcome: Reply | Exception) -> None:
        if self._settled:
            return
        self._settle()
        queued = self._queued
        self._lane._finish(
            self._connection, self._cycle, self._taken, queued.model, self._started, outcome
        )

    def _settle(self) -> None:
        self._settled = True
        self._cycle.on_gone = None
        for future in self._queued.futures:
            future.cancel()  # the rest are not worth running once one failed
        member, self._member = self._member, None
        if member is not None:
            member.release()
        self._lane._settled()


def direct_lane(services: Services, hot: HotRoutes) -> DirectLane | None:
    """The lane where it may serve: asked for, with tracing off (every traced request gets the
    gateway's span) and no API keys (the infer route then needs one)."""
    settings = services.settings
    if not settings.direct_lane or services.tracing is not None:
        return None
    if RoutePolicy(settings, services.drain).needs_key(HTTP_ROUTES.find(kserve_v2.INFER_PATHS[0])):
        return None
    return DirectLane(services, hot)
