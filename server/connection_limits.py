"""uvicorn's httptools protocol with the bounds it lacks against slow, idle and bloated clients.

uvicorn (httptools) accepts headers of any size and count, never times out a connection that
has not finished sending its request, and counts its concurrency limit only once a request's
head is in. So here:
- the request head must arrive within `header_timeout_s` and the body within `body_timeout_s`
  (408 and close), which also closes connections opened and never used;
- a head over `max_header_bytes` or with more than `max_headers` lines gets 431 and a close,
  before it is buffered further;
- beyond `max_connections` open connections a new one gets 503 with Retry-After at once.
Idle keep-alive connections are closed after uvicorn's `timeout_keep_alive` (by one timer per
timeout, not one per answer as uvicorn arms it), except one whose
next request is already waiting in the socket: after the process was stopped (SIGSTOP, a paused
VM or container) for longer than the timeout, the overdue timer runs before the loop reads that
request, and closing with unread data would reset the connection (RST) under the client.

It also hands each request a future that resolves when the client disconnects
(`scope["extensions"]["ferry.disconnected"]`), so that waiting for an answer costs no task
listening on `receive()`; and gives the requests the direct lane takes (server/direct_lane.py)
to it instead of to uvicorn's ASGI cycle, holding later requests of the connection until it
answers, as uvicorn holds pipelined ones.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast, get_args

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ferry.server import request_ids
from ferry.server.coalesced_writes import CoalescedWrites
from ferry.server.dialects import FERRY
from ferry.server.disconnect import DISCONNECTED
from ferry.server.errors import HeadTooLarge, RequestTimeout, TooManyConnections, failure
from ferry.server.repeated_heads import RepeatedHead, repeated_head

Phase = Literal["idle", "head", "body"]
REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
# How long a refused connection is read and dropped before it is closed (as nginx's
# lingering_timeout): time for the client to read the answer before a reset could discard it.
LINGER_S = 2.0
# ferry_connections_refused_total's reasons: a fixed set, whatever the client sends.
RefusalReason = Literal[
    "header_timeout", "body_timeout", "header_too_large", "too_many_connections"
]
REFUSAL_REASONS: tuple[RefusalReason, ...] = get_args(RefusalReason)
Headers = Iterable[tuple[bytes, bytes]]
# The whole answer to a request from its method, URL and headers (and the server's default
# headers), or None for the app to answer it: server/inline_liveness.py's, for probes.
AnswerAsParsed = Callable[[bytes, bytes, Headers, Headers], bytes | None]


class LaneRequest(Protocol):
    """A request the lane serves, standing where uvicorn's cycle would (server/direct_lane.py's
    DirectCycle): uvicorn and these guards read its flags."""

    response_complete: bool
    keep_alive: bool

    def client_left(self) -> None: ...


class Lane(Protocol):
    """What the protocol asks of server/direct_lane.py (which imports what imports this, so it
    is named here by what it does)."""

    @property
    def body_limit(self) -> int: ...

    def takes(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> Any: ...

    def start(
        self, taken: Any, headers: list[tuple[bytes, bytes]], body: bytes, connection: Any
    ) -> LaneRequest | None: ...

    def retakes(self, taken: Any) -> Any: ...


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_headers: int


class GuardedHttpProtocol(HttpToolsProtocol):
    # Set on the subclass that `protocol_class` makes.
    limits: ConnectionLimits
    on_refused: Callable[[RefusalReason], None]
    answer_as_parsed: AnswerAsParsed | None
    direct_lane: Lane | None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's: asyncio's takes a BaseTransport
        writes = CoalescedWrites(transport, asyncio.get_running_loop())
        super().connection_made(writes)  # type: ignore[arg-type]  # a wrapper that forwards to the transport
        self._phase: Phase = "idle"
        self._head_bytes = 0
        self._header_count = 0
        self._closed_by_us = False
        self._answered = False  # this request, a probe answered as it was parsed
        self._timer: asyncio.TimerHandle | None = None
        # The phase the running timer counts down (None: none, or not this request's).
        self._timed: Phase | None = None
        self._direct: list[bytes] | None = None  # the body so far of a request for the lane
        self._taken: Any = None  # that request, as the lane read its head (its own token)
        self._direct_size = 0
        self._lane_pending: LaneRequest | None = None  # the lane's request waiting for its batch
        self._idle_since: float | None = None  # when its last answer went, while idle since
        # The last request the lane served, whose head a next one may repeat (repeated_heads.py).
        self._repeated: RepeatedHead | None = None
        self._begun = 0  # requests begun in the read being parsed
        self._served: tuple[bytes, Any] | None = None  # the lane's (body, taken) in that read
        if len(self.connections) > self.limits.max_connections:
            self._refuse("too_many_connections", TooManyConnections())
            return
        # Also the deadline for a connection that never sends a byte.
        self._arm(self.limits.header_timeout_s)
        self._timed = "head"

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        pending, self._lane_pending = self._lane_pending, None
        if pending is not None:
            pending.client_left()
        # uvicorn cancels the keep-alive timer only on a clean close: a reset left it to fire
        # on a closed socket.
        self._stop_keep_alive()
        if self.cycle is not None and not self.cycle.response_complete:
            gone = cast(
                "asyncio.Future[None] | None",
                self.cycle.scope.get("extensions", {}).get(DISCONNECTED),
            )
            if gone is not None and not gone.done():
                gone.set_result(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closed_by_us:
            return
        idle = self._phase == "idle"
        if idle and self._repeated is not None and self._serve_repeated(self._repeated, data):
            return
        if self._phase != "body":
            self._head_bytes += len(data)
        self._begun = 0
        self._served = None
        super().data_received(data)
        if idle and self._begun == 1 and self._served is not None and self._phase == "idle":
            body, taken = self._served  # the whole read was this one request
            self._repeated = repeated_head(data, body, self.headers, taken)
        if self._phase == "head" and self._head_bytes > self.limits.max_header_bytes:
            message = f"request head over {self.limits.max_header_bytes} bytes"
            self._refuse("header_too_large", HeadTooLarge(message))
        self._time_unfinished()

    def _time_unfinished(self) -> None:
        """After a read: a head or a body it left unfinished is timed from now, once. A read
        that ends between requests (a whole request came in it, as most do) arms nothing;
        arming at each phase's start cost two timers a request, each cancelled microseconds
        later."""
        phase = self._phase
        if phase == "idle" or phase == self._timed or self._closed_by_us:
            return
        if self.transport.is_closing():  # uvicorn refused what it parsed (a 400)
            return
        self._arm(self.limits.header_timeout_s if phase == "head" else self.limits.body_timeout_s)
        self._timed = phase

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun += 1
        # A request began: no keep-alive timeout now, even one armed by a probe answered
        # earlier in the same read (_answer_probe), before this request was parsed.
        self._unset_keepalive_if_required()
        self._phase = "head"
        self._header_count = 0
        self._head_size = 0
        self._timed = None  # timed from the end of this read if the head is still unfinished

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # A head that arrived whole in one read is measured here; a partial one in data_received.
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4
        if self._header_count <= self.limits.max_headers:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._header_count > self.limits.max_headers:
            message = f"more than {self.limits.max_headers} header lines"
            self._refuse("header_too_large", HeadTooLarge(message))
            return
        if self._head_size > self.limits.max_header_bytes:
            message = f"request head over {self.limits.max_header_bytes} bytes"
            self._refuse("header_too_large", HeadTooLarge(message))
            return
        if self._answer_probe():
            return
        self._phase = "body"
        self._head_bytes = 0
        lane = self.direct_lane
        if lane is not None and self._owes_nothing():
            self._taken = lane.takes(self.parser.get_method(), self.url, self.headers)
            if self._taken is not None:
                self._direct = []
                self._direct_size = 0
                return
        self._start_cycle()

    def _start_cycle(self) -> None:
        """uvicorn's cycle for this request, its ASGI task started (or queued behind one)."""
        extensions: dict[str, Any] = {DISCONNECTED: self.loop.create_future()}
        self.scope["extensions"] = extensions
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._closed_by_us or self._answered:
            return
        if self._direct is None:
            super().on_body(body)
            return
        assert self.direct_lane is not None, "a body for the lane without one"
        self._direct.append(body)
        self._direct_size += len(body)
        if self._direct_size > self.direct_lane.body_limit:  # the gateway's (read off the loop)
            read, self._direct = self._direct, None
            self._start_cycle()
            super().on_body(b"".join(read))

    def on_message_complete(self) -> None:
        if self._closed_by_us:
            return
        if self._answered:
            self._answered = False
            return
        self._phase = "idle"
        self._disarm()
        if self._direct is not None:
            assert self.direct_lane is not None, "a body for the lane without one"
            body, self._direct = b"".join(self._direct), None
            assert self._taken is not None, "a body for the lane without its head"
            cycle = self.direct_lane.start(self._taken, self.headers, body, self)
            if cycle is not None:
                self._served = (body, self._taken)
                self._lane_started(cycle)
                return
            self._start_cycle()  # the gateway's after all
            if body:
                super().on_body(body)
        super().on_message_complete()

    def _lane_started(self, cycle: LaneRequest) -> None:
        self.cycle = cycle  # type: ignore[assignment]  # stands in for uvicorn's
        if not cycle.response_complete:
            self._lane_pending = cycle

    def _serve_repeated(self, repeated: RepeatedHead, data: bytes) -> bool:
        """`data` served by the lane without parsing, where it is one request repeating the
        head of the last the lane served (repeated_heads.py); False: parse it."""
        if not self._answered_all():
            return False
        body = repeated.body_of(data)
        if body is None:
            return False
        assert self.direct_lane is not None, "a repeated head without a lane"
        taken = self.direct_lane.retakes(repeated.taken)
        if taken is None:
            return False
        self._unset_keepalive_if_required()  # as uvicorn's data_received does first
        cycle = self.direct_lane.start(taken, repeated.headers, body, self)
        if cycle is None:  # the gateway's (nothing was done): parsed, it goes there
            self._repeated = None
            return False
        self._lane_started(cycle)
        return True

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server_state.default_headers

    def answer_direct(self, cycle: LaneRequest, data: bytes) -> None:
        """The lane's answer to its request, then what follows any answer (server/direct_lane.py's
        Connection)."""
        cycle.response_complete = True
        if self._lane_pending is cycle:
            self._lane_pending = None
        writes = cast(CoalescedWrites, self.transport)
        writes.write_now(data)
        if not cycle.keep_alive:
            writes.close()
        self.on_response_complete()  # keep-alive timer, reads resumed, a queued request started

    def _answered_all(self) -> bool:
        """No request of the connection waits for its answer."""
        if self.pipeline or self._lane_pending is not None:
            return False
        return self.cycle is None or self.cycle.response_complete

    def _owes_nothing(self) -> bool:
        """The connection owes no earlier answer and will be kept open: a request may be
        answered outside uvicorn's cycle without passing one."""
        if not self._answered_all():
            return False
        if self.parser.get_http_version() != "1.1" or not self.parser.should_keep_alive():
            return False
        return not self.parser.should_upgrade()  # a WebSocket handshake is the app's to refuse

    def _answer_probe(self) -> bool:
        """A liveness probe answered now (server/inline_liveness.py), where the connection owes
        no earlier answer and will be kept open; False: the app answers it."""
        if self.answer_as_parsed is None or not self._owes_nothing():
            return False
        reply = self.answer_as_parsed(
            self.parser.get_method(), self.url, self.headers, self.server_state.default_headers
        )
        if reply is None:
            return False
        self._answered = True
        self._phase = "idle"
        self._disarm()
        writes = cast(CoalescedWrites, self.transport)
        writes.write(reply)
        writes.flush()  # now, not at the end of the loop's turn: that is what it saves
        self.on_response_complete()  # keep-alive timer, reads resumed, as after any answer
        return True

    # uvicorn arms a keep-alive timer after each answer and cancels it at the next read: a
    # timer made and cancelled per request (~5 us on uvloop, twice a batch's share of the
    # model's time on a small tabular graph). Here a timer runs once per keep-alive timeout at
    # most: an answer notes the time, a read clears it, and the timer when due closes the
    # connection only if it has been idle that long, else waits out the rest.

    def on_response_complete(self) -> None:
        # uvicorn's, but for the timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_due
            )

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # busy: the timer, when due, finds the connection in use

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        since = self._idle_since
        if since is None:
            return  # in use: its next answer arms the timer again
        left = since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_due)
            return
        self.timeout_keep_alive_handler()

    def _stop_keep_alive(self) -> None:
        self._idle_since = None
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing() and _unread_bytes(self.transport):
            self.timeout_keep_alive_task = None  # the loop reads the request next
            return
        super().timeout_keep_alive_handler()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        self._timed = None
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()  # type: ignore[union-attr]  # checked just above
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        body = self._phase == "body"
        what = "request body" if body else "request head"
        reason: RefusalReason = "body_timeout" if body else "header_timeout"
        self._refuse(reason, RequestTimeout(f"the {what} did not arrive in time"))

    def _request_id(self) -> bytes:
        """The id of a request whose head was read (a body that timed out), else a new one."""
        return request_ids.of_headers(self.cycle.scope["headers"] if self.cycle is not None else ())

    def _refuse(self, reason: RefusalReason, error: Exception) -> None:
        """Answer, count and close; a request already handed to the app sees a disconnect.
        No route is known yet: the answer is in Ferry's own (OpenAI-shaped) dialect."""
        if self._closed_by_us:
            return
        self._closed_by_us = True
        self._disarm()
        self.on_refused(reason)
        reply = FERRY.reply(failure(error))
        head = [
            b"HTTP/1.1 %d %s" % (reply.status, REASONS[reply.status]),
            b"content-type: " + reply.content_type,
            b"content-length: %d" % len(reply.body),
            b"connection: close",
            request_ids.HEADER + b": " + self._request_id(),
            *(name + b": " + value for name, value in reply.headers),
        ]
        # Only if no response has started on this connection: never two heads in one stream.
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + reply.body)
        self._close_lingering()

    def _close_lingering(self) -> None:
        """Close without discarding the answer. Closing a socket with unread input makes the
        kernel send a reset, and a reset can reach the client before it reads the answer (a
        431 for a head it is still sending). So, as nginx's lingering close: send the answer and
        a FIN, read and drop what still arrives until the client closes (then the transport
        closes itself) or `LINGER_S` passes."""
        transport = self.transport
        if transport.is_closing():
            return
        if not transport.can_write_eof():  # TLS: no half-close
            transport.close()
            return
        transport.write_eof()
        self.flow.resume_reading()  # a body that outran the app may have paused it
        self._timer = self.loop.call_later(LINGER_S, transport.close)


def _unread_bytes(transport: asyncio.Transport) -> int:
    """Bytes the client sent that the loop has not read yet (FIONREAD on the socket)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):  # closed meanwhile (its fileno is then -1: a ValueError)
        return 0
    unread: int = struct.unpack("i", raw)[0]
    return unread


def protocol_class(
    limits: ConnectionLimits,
    on_refused: Callable[[RefusalReason], None] = lambda _: None,
    answer_as_parsed: AnswerAsParsed | None = None,
    direct_lane: Lane | None = None,
) -> type[GuardedHttpProtocol]:
    """The protocol class uvicorn instantiates per connection, with these limits; `on_refused`
    hears of every connection it answers itself (408, 431, 503) and closes; `answer_as_parsed`,
    where given, answers the requests it knows (liveness probes) as they are parsed;
    `direct_lane`, where given, serves the requests it takes."""
    attributes = {
        "limits": limits,
        "on_refused": staticmethod(on_refused),
        "answer_as_parsed": staticmethod(answer_as_parsed) if answer_as_parsed else None,
        "direct_lane": direct_lane,
    }
    return type("FerryHttpProtocol", (GuardedHttpProtocol,), attributes)
