"""The API process's end of the boundary: one DEALER socket to the engine process.

Requests are numbered; a reader task resolves each one's futures (encoder rows, a plain graph's
outputs) or feeds its queue (LLM deltas). The engine's death is seen at once through a pidfd on
its process: every waiting request fails with a 503 error, readiness turns 503, and a Hello is
repeated until the restarted engine answers. A stuck engine (stopped, or its loop blocked) is
alive but silent: each encoder or plain-graph request's deadline is kept here too (504 at the
deadline, whatever the engine does), and once the engine has sent nothing (its periodic Stats
included) for `heartbeat_timeout_s`, readiness turns 503 and every stream and call waiting on it
fails with a 503 (EngineStalled).

What a request sends cannot be taken back once handed to ZMQ (its high-water marks are off):
while the engine does not read, the bytes stay queued in this process, past the request's 504.
So each request's bytes are counted until the engine answers it (rows, a failure, or the Reply
to a Cancel), and once `window_bytes` are unanswered new requests are refused at once (429,
QueueFull) instead of queueing more: this process's memory stays bounded whatever the engine
does. The engine's death clears the count (a new engine has none of that work).

A request's large tensors cross through this process's shared memory arena (arena.py) when it
has room, else as frames; a block is freed at the same answers that settle the request's
bytes, and every block at the engine's death.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import zmq
from prometheus_client import Counter, Gauge

from ferry.batcher import TensorRows
from ferry.batcher.cost_model import RowTime
from ferry.batcher.errors import BatcherClosed, DeadlineExceeded, InferenceFailed, QueueFull
from ferry.llm.base import EngineStats, GenerationDelta, SamplingSettings
from ferry.llm.errors import EngineDead, EngineStalled, GenerationFailed
from ferry.server import tracing
from ferry.server.procs import wire
from ferry.server.procs.arena import Arena
from ferry.server.procs.loop_socket import LoopSocket

logger = logging.getLogger(__name__)
HELLO_EVERY_S = 0.25
GAUGE_EVERY_S = 0.25  # how often the unanswered and arena bytes are written to their gauges
WINDOW_RETRY_AFTER_S = 1.0
# The engine holds each request's deadline too and answers when it passes (or refuses one it
# can never meet, a 422): its answer comes first unless it is stuck. Without this grace, a 1 ms
# deadline expired here before the engine's 422 could cross back, a 504 instead.
EXPIRY_GRACE_S = 0.05
# What tells that the engine read a request (a tuple: isinstance on `A | B` builds a union).
ANSWERS = (wire.Row, wire.Failed, wire.Reply)
ENGINE_GONE = "the engine process stopped; it is being restarted"
Row = dict[str, np.ndarray]
CallResult = bool | tuple[str, ...] | None


class EngineClient:
    def __init__(
        self,
        address: str,
        heartbeat_timeout_s: float,
        window_bytes: int,
        unanswered_gauge: Gauge | None = None,
        arena: Arena | None = None,
        arena_gauges: tuple[Gauge, Counter] | None = None,
        on_serving: Callable[[int], None] | None = None,
    ) -> None:
        self._address = address
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._window_bytes = window_bytes
        # Per request id, the bytes sent to the engine that it has not answered yet; their sum.
        self._unanswered: dict[int, int] = {}
        self.unanswered_bytes = 0
        # Written off the request path (a gauge write costs more than the dict's insert).
        self._gauge = unanswered_gauge
        self._arena = arena
        self._arena_gauges = arena_gauges  # its bytes in use, its fallbacks to frames
        self._arena_mapped = False  # by the engine serving now (its Info said)
        # Told the engine's pid at each of its reports, 0 when it stops (port_role.py).
        self._on_serving = on_serving
        self._heard = 0.0  # time.monotonic() of the engine's latest message
        self._context = zmq.Context()
        self._socket: LoopSocket | None = None
        self._ids = itertools.count(1)
        self._rows: dict[int, list[asyncio.Future[Row]]] = {}
        self._streams: dict[int, asyncio.Queue[GenerationDelta | BaseException]] = {}
        self._replies: dict[int, asyncio.Future[CallResult]] = {}
        self.info: wire.Info | None = None
        self.adapters: dict[str, tuple[str, ...]] = {}  # per LLM, as the engine last said
        self.classes: dict[str, dict[str, list[str | int]]] = {}  # per graph, learned late
        self.stats: wire.Stats | None = None
        self._connected = asyncio.Event()
        self._pidfd: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Set by the registry: applies the engine's models (a load or unload, a restart).
        self.on_models: Callable[[wire.Info], Awaitable[None]] | None = None
        self._updates: set[asyncio.Task[None]] = set()

    @property
    def alive(self) -> bool:
        return self._connected.is_set()

    @property
    def responsive(self) -> bool:
        """Alive, and heard from lately (it reports Stats every STATS_EVERY_S): what readiness
        reads, so that a stopped engine is visible to the load balancer."""
        silent_s = time.monotonic() - self._heard
        return self.alive and silent_s <= self._heartbeat_timeout_s

    def started(self) -> wire.Info:
        """What the engine process told at start: its models (it started the real ones)."""
        assert self.info is not None, "start the client first"
        return self.info

    def ready(self, name: str, llm: bool = False) -> bool:
        """The engine's model (or LLM) `name` is ready, by a report heard lately."""
        stats = self.stats
        if not self.responsive or stats is None:
            return False
        return (stats.llms_ready if llm else stats.models_ready).get(name, False)

    async def start(self) -> wire.Info:
        """Waits for the engine's first answer (it may still be loading its models)."""
        socket = self._context.socket(zmq.DEALER)
        socket.connect(self._address)
        self._socket = LoopSocket(socket, wire.to_api, wire.frame_count, self._receive)
        self._tasks = [
            asyncio.create_task(self._greet()),
            asyncio.create_task(self._watch_silence()),
        ]
        self._tasks.append(asyncio.create_task(self._report_bytes()))
        await self._connected.wait()
        assert self.info is not None
        return self.info

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._unwatch()
        if self._socket is not None:
            self._socket.close()
        self._context.term()
        if self._arena is not None:
            self._arena.close()

    # -- encoder requests ----------------------------------------------------------------------

    def submit(
        self,
        model: str,
        rows: TensorRows,
        timeout_s: float | None,
        outputs: tuple[str, ...] | None,
        priority: int,
        deadline_s: float | None = None,
        answers: int = 1,
    ) -> list[asyncio.Future[Row]]:
        """A validated request (its tensors, wire.Submit), `answers` futures: one a row of a
        token model (`wire.sequence_rows`), one for a plain graph's. `timeout_s` is the
        request's own (None: the model's default, applied by the engine); `deadline_s` is the
        one both apply, kept here too."""
        rid = next(self._ids)
        header, frames = wire.pack_request(
            rid, model, rows, timeout_s, outputs, priority, tracing.carrier()
        )
        return self._request(rid, answers, header, frames, deadline_s)

    def _request(
        self,
        rid: int,
        count: int,
        header: wire.Submit,
        frames: Sequence[bytes | memoryview],
        deadline_s: float | None,
    ) -> list[asyncio.Future[Row]]:
        """Sent, and `count` futures resolved by the engine's Rows (or Failed) for `rid`.
        Refused (QueueFull) while the window is full; one request larger than the window is
        sent when nothing else is unanswered."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(count)]
        if not self.alive:
            for future in futures:
                future.set_exception(BatcherClosed(ENGINE_GONE))
            return futures
        size = sum(map(len, frames))  # bytes, or memoryviews cast to bytes ("B")
        if self.unanswered_bytes and self.unanswered_bytes + size > self._window_bytes:
            raise QueueFull(
                WINDOW_RETRY_AFTER_S,
                f"{self.unanswered_bytes} bytes of requests sent to the engine process are "
                f"not answered yet (engine_window_bytes = {self._window_bytes}); retry later",
            )
        self._rows[rid] = futures
        self._unanswered[rid] = size
        self.unanswered_bytes += size
        if self._arena_mapped:
            assert self._arena is not None
            header.arena = self._arena.place(rid, frames)
            if header.arena:
                frames = [f for i, f in enumerate(frames) if i not in header.arena]
        self._send(header, frames)

        def cancelled(future: asyncio.Future[Row]) -> None:
            # The caller dropped its futures (client gone, or another item failed): the engine
            # drops the rest from its queue.
            if future.cancelled() and self._rows.pop(rid, None) is not None:
                self._send(wire.Cancel(rid))

        for future in futures:
            future.add_done_callback(cancelled)
        if deadline_s is not None:
            self._expire_at(rid, futures, deadline_s)
        return futures

    def _expire_at(self, rid: int, futures: list[asyncio.Future[Row]], timeout_s: float) -> None:
        """The deadline holds here even if the engine never answers (stopped, its loop stuck).
        No Cancel: the engine keeps the same deadline and drops the work itself (counted there
        as `deadline`, not `cancelled`); its late rows find no request and are dropped. The
        request's bytes stay unanswered until then."""

        def expire() -> None:
            if self._rows.get(rid) is futures:
                del self._rows[rid]
            for future in futures:
                if not future.done():
                    future.set_exception(DeadlineExceeded("the request's deadline passed"))

        timer = asyncio.get_running_loop().call_later(timeout_s + EXPIRY_GRACE_S, expire)

        def settled(_: asyncio.Future[Row]) -> None:
            if all(f.done() for f in futures):
                timer.cancel()

        for future in futures:
            future.add_done_callback(settled)

    # -- LLM streams ---------------------------------------------------------------------------

    async def admit(self, model: str, count: int) -> int:
        """The engine admits `count` generations together (or none: EngineOverloaded); they
        start under the ticket returned, and `release` it once the request ended."""
        self._check_up()
        ticket = next(self._ids)
        try:
            await self._ask(wire.Admit(ticket, model, count))
        except BaseException:
            # Given up on (stalled, or the client left): the engine may admit it when it reads
            # it. Released after it, in order; a refused ticket's release is ignored.
            self.release(ticket)
            raise
        return ticket

    def release(self, ticket: int) -> None:
        if self.alive:  # a restarted engine never knew the ticket
            self._send(wire.Release(ticket))

    async def generate(
        self,
        model: str,
        ticket: int,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingSettings,
        adapter: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[GenerationDelta]:
        self._check_up()
        rid = next(self._ids)
        queue: asyncio.Queue[GenerationDelta | BaseException] = asyncio.Queue()
        self._streams[rid] = queue
        message = wire.Generate(
            rid,
            ticket,
            model,
            request_id,
            prompt_ids,
            sampling,
            adapter,
            priority,
            cache_salt,
            tracing.carrier(),
        )
        self._send(message)
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finish_reason is not None
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished and self.alive:
                self._send(wire.Cancel(rid))

    async def call(self, model: str, method: str, *args: str) -> CallResult:
        self._check_up()
        return await self._ask(wire.Call(next(self._ids), model, method, args))

    async def _ask(self, message: wire.Call | wire.Admit) -> CallResult:
        """Send, and wait for its Reply (the engine's error raised here)."""
        future: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        self._replies[message.rid] = future
        self._send(message)
        try:
            return await future
        finally:
            self._replies.pop(message.rid, None)

    def _check_up(self) -> None:
        """Refuse at once what could only wait: the engine is restarting, or silent."""
        if not self.alive:
            raise EngineDead(ENGINE_GONE)
        if not self.responsive:
            raise self._stalled()

    def _stalled(self) -> EngineStalled:
        silent_s = time.monotonic() - self._heard
        return EngineStalled(
            f"the engine process has sent nothing for {silent_s:.1f} s (stopped, or stuck); "
            "retry later"
        )

    def fastest_row(self, model: str) -> RowTime | None:
        """The engine's encoder `model`'s time for a row alone, by its last report."""
        return None if self.stats is None else self.stats.fastest_rows.get(model)

    def llm_stats(self, model: str) -> EngineStats | None:
        return None if self.stats is None else self.stats.llms.get(model)

    # -- the socket ----------------------------------------------------------------------------

    def _send(self, header: wire.ToEngine, frames: Sequence[bytes | memoryview] = ()) -> None:
        assert self._socket is not None, "start the client first"
        self._socket.send(header, frames)

    def _receive(self, _: bytes | None, header: object, frames: list[memoryview]) -> None:
        self._heard = time.monotonic()
        self._handle(header, frames)  # type: ignore[arg-type]  # the decoder yields only ToApi

    def _handle(self, message: wire.ToApi, frames: list[memoryview]) -> None:
        future: asyncio.Future[Any] | None  # a row's or a call's
        if isinstance(message, ANSWERS):
            # Whatever became of its request here (expired, cancelled): the engine has read it,
            # and copied its tensors out of the arena.
            self.unanswered_bytes -= self._unanswered.pop(message.rid, 0)
            if self._arena is not None:
                self._arena.free(message.rid)
        if isinstance(message, wire.Row):
            futures = self._rows.get(message.rid)
            if futures is not None:
                future = futures[message.index]
                if not future.done():
                    future.set_result(wire.unpack_row(message, frames))
                if all(f.done() for f in futures):
                    self._rows.pop(message.rid, None)
        elif isinstance(message, wire.Delta):
            queue = self._streams.get(message.rid)
            if queue is not None:
                queue.put_nowait(message.delta)
        elif isinstance(message, wire.Failed):
            self._failed(message)
        elif isinstance(message, wire.Reply):
            future = self._replies.get(message.rid)
            if future is not None and not future.done():
                if message.error is not None:
                    future.set_exception(wire.error_from_wire(message.error, RuntimeError))
                else:
                    future.set_result(message.value)
        elif isinstance(message, wire.Stats):
            self.stats = message
            if self._on_serving is not None and self.alive and self.info is not None:
                self._on_serving(self.info.pid)
        elif isinstance(message, wire.Classes):
            self.classes[message.model] = message.keys
        elif isinstance(message, wire.Adapters):
            self.adapters[message.model] = message.names
            self._send(wire.Ack(message.seq))
        elif isinstance(message, wire.Models):
            self._models_changed(message.info, message.seq)
        elif isinstance(message, wire.Info):
            self._engine_up(message)

    def _models_changed(self, info: wire.Info, seq: int | None) -> None:
        """The engine serves other models: applied by the registry, then acked (`seq`)."""
        self.info = info
        self.adapters = {llm.name: llm.adapters for llm in info.llms}

        async def apply() -> None:
            try:
                if self.on_models is not None:
                    await self.on_models(info)
            except Exception:
                logger.exception("the engine's models could not be applied")
            finally:
                if seq is not None:
                    self._send(wire.Ack(seq))

        task = asyncio.create_task(apply())
        self._updates.add(task)
        task.add_done_callback(self._updates.discard)

    def _failed(self, message: wire.Failed) -> None:
        queue = self._streams.get(message.rid)
        if queue is not None:
            queue.put_nowait(wire.error_from_wire(message.error, GenerationFailed))
            return
        futures = self._rows.get(message.rid)
        if futures is None:
            return
        targets = futures if message.index < 0 else [futures[message.index]]
        for future in targets:
            if not future.done():
                future.set_exception(wire.error_from_wire(message.error, InferenceFailed))
        if all(f.done() for f in futures):
            self._rows.pop(message.rid, None)

    # -- the engine's life ---------------------------------------------------------------------

    async def _greet(self) -> None:
        """Hello until an engine answers (at start, and after each restart)."""
        while True:
            if not self.alive:
                arena = "" if self._arena is None else str(self._arena.path)
                self._send(wire.Hello(os.getpid(), arena))
            await asyncio.sleep(HELLO_EVERY_S)

    def _engine_up(self, info: wire.Info) -> None:
        if self.alive and self.info is not None and self.info.pid == info.pid:
            return
        if self.alive:  # a new engine, before the old one's death was seen
            self._engine_down()
        if self.info is not None:  # a restarted engine: it serves its start's models
            self._models_changed(info, None)
        self.info = info
        self.adapters = {llm.name: llm.adapters for llm in info.llms}
        self._arena_mapped = info.arena and self._arena is not None
        self._connected.set()
        self._watch(info.pid)
        logger.info("engine process %d connected", info.pid)

    def _watch(self, pid: int) -> None:
        self._unwatch()
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pidfd = None
            asyncio.get_running_loop().call_soon(self._engine_down)
            return
        asyncio.get_running_loop().add_reader(self._pidfd, self._engine_down)

    def _unwatch(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    async def _watch_silence(self) -> None:
        """Streams and calls have no deadline of their own: an engine silent for
        `heartbeat_timeout_s` (it reports every STATS_EVERY_S) ends them, as vLLM V0's engine
        iteration timeout does. Checked 4 times per timeout: it fires by 1.25x the timeout."""
        while True:
            await asyncio.sleep(self._heartbeat_timeout_s / 4)
            if self.alive and not self.responsive and (self._streams or self._replies):
                self._engine_stalled()

    async def _report_bytes(self) -> None:
        unanswered = used = fallbacks = 0
        while True:
            if self._gauge is not None and self.unanswered_bytes != unanswered:
                unanswered = self.unanswered_bytes
                self._gauge.set(unanswered)
            if self._arena is not None and self._arena_gauges is not None:
                used_gauge, fallback_counter = self._arena_gauges
                if self._arena.blocks.used != used:
                    used = self._arena.blocks.used
                    used_gauge.set(used)
                if self._arena.fallbacks != fallbacks:
                    fallback_counter.inc(self._arena.fallbacks - fallbacks)
                    fallbacks = self._arena.fallbacks
            await asyncio.sleep(GAUGE_EVERY_S)

    def _engine_stalled(self) -> None:
        logger.error(
            "engine process silent for %.1f s: failing %d streams and calls",
            time.monotonic() - self._heard,
            len(self._streams) + len(self._replies),
        )
        streams, self._streams = self._streams, {}
        for rid, queue in streams.items():
            queue.put_nowait(self._stalled())
            self._send(wire.Cancel(rid))  # read once it resumes: it stops the generation
        for future in self._replies.values():
            if not future.done():
                future.set_exception(self._stalled())

    def _engine_down(self) -> None:
        """Every request waiting on the dead engine fails now, with a 503."""
        if not self.alive:
            return
        logger.error("engine process stopped: failing %d waiting requests", self.waiting)
        self._connected.clear()
        if self._on_serving is not None:
            self._on_serving(0)
        self._unwatch()
        self.stats = None
        # Nothing of it will be answered: a new engine reads and drops what was sent to the old.
        self._unanswered.clear()
        self.unanswered_bytes = 0
        self._arena_mapped = False  # until the next engine maps it
        if self._arena is not None:
            self._arena.clear()
        rows, self._rows = self._rows, {}
        future: asyncio.Future[Any]  # a row's, then a call's
        for futures in rows.values():
            for future in futures:
                if not future.done():
                    future.set_exception(BatcherClosed(ENGINE_GONE))
        for queue in self._streams.values():
            queue.put_nowait(EngineDead(ENGINE_GONE))
        for future in self._replies.values():
            if not future.done():
                future.set_exception(EngineDead(ENGINE_GONE))

    @property
    def waiting(self) -> int:
        return len(self._rows) + len(self._streams) + len(self._replies)
