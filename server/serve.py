"""Run the app under uvicorn, with a drain phase before uvicorn's own shutdown.

Plain uvicorn closes its listening socket on SIGTERM at once, so a load balancer that has not yet
seen readiness fail sends new connections into a void. Ferry first drains: readiness and new
inference requests answer 503 with Retry-After while accepted requests finish (up to
`drain_timeout_s`); only then does uvicorn stop, and the process exits 0. A second signal stops
at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI

from ferry.server.app import FerryAPI
from ferry.server.connection_limits import ConnectionLimits, protocol_class
from ferry.server.direct_lane import direct_lane
from ferry.server.gateway import LIVENESS
from ferry.server.gc_pauses import GcPauseWatch, keep_gc_off_serving_path
from ferry.server.inline_liveness import InlineLiveness
from ferry.server.loop_lag import LoopLagWatch, watch_loop_lag
from ferry.server.services import app_services
from ferry.server.settings import Settings

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._drain_timeout_s = drain_timeout_s
        self._drain_task: asyncio.Future[None] | None = None
        self._gc_watch: GcPauseWatch | None = None
        self._lag_watch: LoopLagWatch | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # the lifespan first: models started and warm
        if self.started:
            metrics = app_services(self._app).metrics
            self._gc_watch = keep_gc_off_serving_path(metrics)
            self._lag_watch = watch_loop_lag(metrics)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._lag_watch is not None:
            await self._lag_watch.stop()
        await super().shutdown(sockets)
        if self._gc_watch is not None:  # before the loop closes: collections after it are not timed
            self._gc_watch.remove()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is not None or self._drain_timeout_s <= 0:
            super().handle_exit(sig, frame)
            return
        drain = app_services(self._app).drain
        drain.begin()
        logger.info("draining: %d requests in flight", drain.in_flight)

        async def finish_then_exit() -> None:
            finished = await drain.wait_idle(self._drain_timeout_s)
            if not finished:
                logger.warning("drain timeout: %d requests still in flight", drain.in_flight)
                # Each answers 503 (a stream: an error event and [DONE]) as it unwinds.
                drain.expire()
                await drain.wait_idle(1.0)
            # Set directly, not through uvicorn's handle_exit, which would re-raise the signal
            # after shutdown: a drained stop is a clean exit (status 0).
            self.should_exit = True

        # Called from a signal handler: hand the work to the loop in a way that wakes it.
        loop = asyncio.get_event_loop()
        self._drain_task = loop.create_future()  # marks the drain as begun for a second signal
        loop.call_soon_threadsafe(lambda: loop.create_task(finish_then_exit()))


def serve(app: FerryAPI, settings: Settings, sockets: list[socket.socket] | None = None) -> None:
    """`sockets`: a listening socket shared by API processes (server/procs); else bind."""
    sys.setswitchinterval(settings.gil_switch_interval_ms / 1000)
    services = app_services(app)
    # Probes answered as parsed, except where the gateway has more to do for them: a span of
    # their own (tracing), or a key to check.
    inline = services.tracing is None and not settings.api_key_protects_health
    bodies = {path: reply.body for path, reply in LIVENESS.items()}
    liveness = InlineLiveness(services.metrics, bodies).answer if inline else None
    limits = ConnectionLimits(
        max_connections=settings.max_connections,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # uvicorn's loggers write through the process's handler (server/logs.py): one format,
        # and the request id on its access log.
        log_config=None,
        access_log=settings.access_log,
        # X-Forwarded-For only matters to the access log; it costs every request otherwise.
        proxy_headers=settings.access_log,
        http=protocol_class(
            limits, services.metrics.connection_refused, liveness, direct_lane(services, app.hot)
        ),
        timeout_keep_alive=max(1, round(settings.keep_alive_timeout_s)),
        # A backstop after the drain: connections still open then are closed.
        timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
    )
    DrainingServer(config, app, settings.drain_timeout_s).run(sockets=sockets)
