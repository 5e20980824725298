"""The engine process: every batcher, backend and LLM engine, behind one ROUTER socket.

API processes send validated sequences, plain graphs' validated tensors and generation
requests; rows go back as raw tensor frames, generations as deltas. The loop here only moves
messages: tokenizing, validating and rendering all happened in the API processes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import zmq

from ferry.batcher import TensorRows
from ferry.batcher import tracing as batcher_tracing
from ferry.llm.base import GenerationDelta, LLMEngine
from ferry.llm.errors import EngineDead
from ferry.server.errors import UnknownModel
from ferry.server.gc_pauses import keep_gc_off_serving_path
from ferry.server.graph_runtime import GraphRuntime
from ferry.server.logs import configure_logging
from ferry.server.loop_lag import watch_loop_lag
from ferry.server.metrics import FerryMetrics
from ferry.server.model_overrides import Entry, entry_from_json, entry_json
from ferry.server.model_repository import ModelRepository, repository_entries
from ferry.server.model_runtime import ModelRuntime
from ferry.server.procs import wire
from ferry.server.procs.adapter_journal import AdapterJournal, restore
from ferry.server.procs.arena import ArenaReader
from ferry.server.procs.llm_admission import Tickets
from ferry.server.procs.loop_socket import LoopSocket
from ferry.server.procs.parent import on_parent_exit
from ferry.server.progress import loading_progress
from ferry.server.registry import ModelRegistry
from ferry.server.settings import LLMSettings, Settings
from ferry.server.tracing import start_tracing

logger = logging.getLogger(__name__)
STATS_EVERY_S = 0.25
ACK_TIMEOUT_S = 2.0


class EngineServer:
    def __init__(self, settings: Settings, address: str, journal: AdapterJournal) -> None:
        self._settings = settings
        self._address = address
        self._journal = journal
        self._metrics = metrics = FerryMetrics(priority_levels=settings.priority_levels)
        # The models served at start; a load or unload (a Call) changes them.
        self.registry = ModelRegistry.local(settings, metrics)
        served = settings.served_at_start()
        # Each served model's settings as JSON, for the API processes (wire.Info).
        self._entries = {name: entry_json(m) for name, m in repository_entries(served).items()}
        # Per LLM, the adapters it serves and where each came from (the journal's content).
        self._adapters = {
            m.name: {name: str(path) for name, path in m.adapters.items()}
            for m in served.llm_models
        }
        self._peers: set[bytes] = set()
        self._pidfds: dict[bytes, int] = {}  # per API process, a pidfd on it (its exit)
        self._arenas: dict[bytes, ArenaReader] = {}  # per API process, its arena mapped
        self._calls: set[asyncio.Task[None]] = set()
        self._seq = itertools.count(1)
        self._acks: dict[int, tuple[set[bytes], asyncio.Event]] = {}
        self._rows: dict[tuple[bytes, int], list[asyncio.Future[dict[str, np.ndarray]]]] = {}
        self._streams: dict[tuple[bytes, int], asyncio.Task[None]] = {}
        self._tickets = Tickets()  # LLM admission, for every API process at once
        self._classes_told: dict[str, int] = {}  # per graph, its ZipMap outputs announced
        self._context = zmq.Context()
        self._socket: LoopSocket | None = None
        # The engine's own spans (queue, batch, backend), in the traces API processes send.
        self._tracing = start_tracing(settings)

    # The registry's, typed as what they are here: the rows of API processes go to them.
    @property
    def engines(self) -> dict[str, LLMEngine]:
        return self.registry.llms

    @property
    def encoders(self) -> dict[str, ModelRuntime]:
        return cast(dict[str, ModelRuntime], self.registry.encoders)

    @property
    def graphs(self) -> dict[str, GraphRuntime]:
        return cast(dict[str, GraphRuntime], self.registry.graphs)

    def _engine(self, name: str) -> LLMEngine:
        engine = self.engines.get(name)
        if engine is None:  # unloaded since the API process looked
            raise UnknownModel(name, self.registry.names())
        return engine

    async def run(self, stop: asyncio.Event, on_ready: Callable[[], None] | None = None) -> None:
        with loading_progress(self.registry.loads()) as progress:
            await self.registry.start(progress)
        await self._restore_adapters()  # before the socket: no API process sees the old set
        socket = self._context.socket(zmq.ROUTER)
        socket.bind(self._address)
        self._socket = LoopSocket(
            socket, wire.to_engine, wire.frame_count, self._receive, routed=True
        )
        logger.info("engine process %d serving %s", os.getpid(), self._address)
        gc_watch = keep_gc_off_serving_path(self._metrics)
        lag_watch = watch_loop_lag(self._metrics)
        if on_ready is not None:
            on_ready()
        report = asyncio.create_task(self._report())
        # Poll model control: the engine reads the repository, for every API process.
        repository = ModelRepository(
            self._settings, self.registry, self._metrics, on_change=self._repository_changed
        )
        repository.start()
        await stop.wait()
        await repository.close()
        report.cancel()
        for peer in list(self._pidfds):
            self._unwatch(peer)
        await self.registry.close(self._settings.drain_timeout_s)  # encoders drain, then engines
        self._socket.close()
        self._context.term()
        for arena in self._arenas.values():  # no request reads them any more
            arena.close()
        if self._tracing is not None:
            await asyncio.to_thread(self._tracing.shutdown)  # exports what is buffered
        await lag_watch.stop()
        gc_watch.remove()  # before the loop closes

    def _send(
        self, peer: bytes, header: wire.ToApi, frames: Sequence[memoryview | bytes] = ()
    ) -> None:
        assert self._socket is not None
        self._socket.send(header, frames, peer)

    def _receive(self, peer: bytes | None, header: object, frames: list[memoryview]) -> None:
        assert peer is not None
        self._handle(peer, header, frames)  # type: ignore[arg-type]  # the decoder yields only ToEngine

    def _handle(self, peer: bytes, message: wire.ToEngine, frames: list[memoryview]) -> None:
        if peer not in self._peers and not isinstance(message, wire.Hello):
            # Sent by a process that has exited (read after its pidfd fired), or queued for a
            # previous engine: no one waits for the answer, so the work is not started.
            return
        if isinstance(message, wire.Submit):
            self._submit(peer, message, frames)
        elif isinstance(message, wire.Admit):
            self._admit(peer, message)
        elif isinstance(message, wire.Release):
            self._tickets.release((peer, message.ticket))
        elif isinstance(message, wire.Generate):
            self._start(peer, message)
        elif isinstance(message, wire.Cancel):
            self._cancel((peer, message.rid))
            self._send(peer, wire.Reply(message.rid))  # the API process counts it answered
        elif isinstance(message, wire.Call):
            task = asyncio.create_task(self._call(peer, message))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        elif isinstance(message, wire.Ack):
            self._acked(peer, message.seq)
        elif isinstance(message, wire.Hello):
            if peer not in self._peers:
                self._peers.add(peer)
                self._watch(peer, message.pid)
                self._map_arena(peer, message.arena)
            self._send(peer, self._info(arena=peer in self._arenas))
            self._send(peer, self._stats_now())

    # -- the API processes' lives ---------------------------------------------------------------

    def _watch(self, peer: bytes, pid: int) -> None:
        """A pidfd on the API process: its exit is seen at once (ZMQ says nothing of it)."""
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            loop.call_soon(self._peer_gone, peer, pid)
            return
        self._pidfds[peer] = fd
        loop.add_reader(fd, self._peer_gone, peer, pid)

    def _unwatch(self, peer: bytes) -> None:
        fd = self._pidfds.pop(peer, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _map_arena(self, peer: bytes, path: str) -> None:
        """The API process's arena, mapped once; without it, it sends every tensor as a frame."""
        if not path:
            return
        try:
            self._arenas[peer] = ArenaReader(path)
        except (OSError, ValueError) as exc:
            logger.warning("arena %s not mapped (%s): its tensors cross the socket", path, exc)

    def _peer_gone(self, peer: bytes, pid: int) -> None:
        """An API process exited: its generations are aborted and its queued rows dropped (no
        one reads them), and no adapter update waits for its answer."""
        self._unwatch(peer)
        arena = self._arenas.pop(peer, None)
        if arena is not None:
            arena.close()
        self._peers.discard(peer)
        streams = [key for key in self._streams if key[0] == peer]
        rows = [key for key in self._rows if key[0] == peer]
        for key in streams + rows:
            self._cancel(key)
        self._tickets.release_all(peer)
        for seq in list(self._acks):
            self._acked(peer, seq)
        # A drained process (a shutdown) leaves nothing: worth a warning only when it did.
        level = logging.WARNING if streams or rows else logging.INFO
        logger.log(
            level,
            "API process %d exited: generations aborted: %d, encoder requests dropped: %d",
            pid,
            len(streams),
            len(rows),
        )

    # -- encoder requests ----------------------------------------------------------------------

    def _submit(self, peer: bytes, message: wire.Submit, frames: Sequence[wire.Buffer]) -> None:
        """A request to its model's batcher: a plain graph's rows as they are, a token model's
        as its sequences (wire.sequence_rows). Its tensors in the arena are copied out now."""
        try:
            if message.arena:
                frames = self._arenas[peer].frames(message.arena, frames)
            rows = wire.unpack_request(message, frames)
        except Exception as exc:  # answered all the same: the API process frees the block
            self._send(peer, wire.Failed(message.rid, -1, wire.error_to_wire(exc)))
            return
        graph = self.graphs.get(message.model)
        if graph is not None:
            self._submit_graph(peer, message, graph, rows)
            return
        sequences = wire.row_sequences(rows)
        outputs = None if message.outputs is None else frozenset(message.outputs)
        try:
            model = self.encoders[self.registry.get(message.model).name]  # the registry's 404
            if message.timeout_s is not None:  # the floor needs the cost model, which lives here
                model.check_deadline(max(seq.length for seq in sequences), message.timeout_s)
            with self._traced(message.trace):
                futures = model.submit_rows(sequences, message.timeout_s, outputs, message.priority)
        except Exception as exc:
            failed = wire.Failed(message.rid, -1, wire.error_to_wire(exc))
            self._send(peer, failed)
            return
        key = (peer, message.rid)
        self._rows[key] = futures
        for index, future in enumerate(futures):
            future.add_done_callback(partial(self._row_done, key, index))

    def _submit_graph(
        self, peer: bytes, message: wire.Submit, model: GraphRuntime, rows: TensorRows
    ) -> None:
        # A task, kept as the request's one future: a Cancel cancels it, and with it the
        # queued item (the model's own infer also puts a split request back together).
        with self._traced(message.trace):  # the task takes the context as it is now
            task = asyncio.ensure_future(
                model.infer(
                    rows,
                    message.outputs or (),
                    timeout_s=message.timeout_s,
                    priority=message.priority,
                )
            )
        key = (peer, message.rid)
        self._rows[key] = [task]
        task.add_done_callback(lambda _: self._tell_classes(model))  # before the answer
        task.add_done_callback(partial(self._row_done, key, 0))

    @contextmanager
    def _traced(self, carrier: dict[str, str]) -> Iterator[None]:
        """The request's trace, sent by its API process, current while it is queued here."""
        request = None if self._tracing is None or not carrier else self._tracing.remote(carrier)
        if request is None:
            yield
            return
        token = batcher_tracing.current.set(request)
        try:
            yield
        finally:
            batcher_tracing.current.reset(token)

    def _tell_classes(self, model: GraphRuntime) -> None:
        """ZipMap classes the graph learned since the API processes last heard (its Info was
        sent before a first answer taught them): every API process renders by them."""
        keys = model.class_keys
        if len(keys) > self._classes_told.get(model.name, 0):
            self._classes_told[model.name] = len(keys)
            told = wire.Classes(model.name, {name: list(k) for name, k in keys.items()})
            for api in self._peers:
                self._send(api, told)

    def _row_done(
        self, key: tuple[bytes, int], index: int, future: asyncio.Future[dict[str, np.ndarray]]
    ) -> None:
        futures = self._rows.get(key)
        if futures is not None and (len(futures) == 1 or all(f.done() for f in futures)):
            del self._rows[key]
        if future.cancelled():
            return
        peer, rid = key
        error = future.exception()
        if error is None:
            self._send(peer, *wire.pack_row(rid, index, future.result()))
        else:
            message = wire.Failed(rid, index, wire.error_to_wire(error))
            self._send(peer, message)

    def _cancel(self, key: tuple[bytes, int]) -> None:
        for future in self._rows.pop(key, ()):
            future.cancel()
        task = self._streams.pop(key, None)
        if task is not None:
            task.cancel()

    # -- LLM streams ---------------------------------------------------------------------------

    def _admit(self, peer: bytes, message: wire.Admit) -> None:
        reply = wire.Reply(message.rid, True)
        try:
            engine = self._engine(message.model)
            self._tickets.admit((peer, message.rid), engine, message.count)
        except Exception as exc:
            reply = wire.Reply(message.rid, error=wire.error_to_wire(exc))
        self._send(peer, reply)

    def _start(self, peer: bytes, message: wire.Generate) -> None:
        if not self._tickets.start((peer, message.ticket)):
            gone = EngineDead("the engine process restarted since this request was admitted")
            self._send(peer, wire.Failed(message.rid, -1, wire.error_to_wire(gone)))
            return
        task = asyncio.create_task(self._generate(peer, message))
        self._streams[(peer, message.rid)] = task
        # A done callback, not `finally`: it runs even for a task cancelled before it started.
        task.add_done_callback(lambda _: self._tickets.end(message.model))

    async def _generate(self, peer: bytes, message: wire.Generate) -> None:
        try:
            engine = self._engine(message.model)
            # Every engine's generate is an async generator, which has aclose.
            stream = cast(
                AsyncGenerator[GenerationDelta, None],
                engine.generate(
                    message.request_id,
                    message.prompt_ids,
                    message.sampling,
                    adapter=message.adapter,
                    priority=message.priority,
                    cache_salt=message.cache_salt,
                ),
            )
            try:
                async for delta in stream:
                    if delta.finish_reason is not None:
                        # Before the client sees its end: a scrape after it, by whichever API
                        # process, counts its tokens.
                        stats = self._stats_now()
                        for api in self._peers:
                            self._send(api, stats)
                    self._send(peer, wire.Delta(message.rid, delta))
            finally:
                await stream.aclose()  # cancelled (the client left): the engine aborts it
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            failed = wire.Failed(message.rid, -1, wire.error_to_wire(exc))
            self._send(peer, failed)
        finally:
            self._streams.pop((peer, message.rid), None)

    async def _call(self, peer: bytes, message: wire.Call) -> None:
        reply = wire.Reply(message.rid)
        try:
            if message.method == wire.SYNC:
                self._send(peer, reply)
                return
            if message.method in ("load_model", "unload_model"):
                await self._change_models(message)
                self._send(peer, reply)
                return
            engine = self._engine(message.model)
            served = self._adapters[message.model]
            if message.method == "load_adapter":
                name, path = message.args
                await engine.load_adapter(name, Path(path))
                served[name] = path
            elif message.method == "unload_adapter":
                await engine.unload_adapter(message.args[0])
                served.pop(message.args[0], None)
            self._journal.write(self._adapters)
            await self._publish_adapters(message.model, tuple(engine.adapter_names()))
        except Exception as exc:
            reply.error = wire.error_to_wire(exc)
        self._send(peer, reply)

    async def _change_models(self, message: wire.Call) -> None:
        """A load (args: the entry as JSON) or an unload of `message.model`: done here, and
        every API process told before the answer. An unloaded model is taken out and every
        API process told first, so that no new request reaches it; then it drains."""
        name = message.model
        if message.method == "load_model":
            entry = entry_from_json(message.args[0])
            await self.registry.load(entry)
            self._entries[name] = message.args[0]
            if isinstance(entry, LLMSettings):
                self._adapters[name] = {a: str(path) for a, path in entry.adapters.items()}
            await self._publish_models()
            return
        model = self.registry.take(name)
        if model is None:
            return
        self._entries.pop(name, None)
        self._adapters.pop(name, None)
        await self._publish_models()
        await self.registry.retire(model)

    async def _repository_changed(self, served: Mapping[str, Entry]) -> None:
        self._entries = {
            name: entry_json(served[name]) for name in self.registry.names() if name in served
        }
        await self._publish_models()

    async def _publish_models(self) -> None:
        stats, info = self._stats_now(), self._info()
        for peer in self._peers:  # its readiness first: a model loaded is ready at once
            self._send(peer, stats)
        await self._publish(lambda seq: wire.Models(seq, info), "models")

    async def _restore_adapters(self) -> None:
        """A restarted engine serves the adapters its predecessor served at its end."""
        for model, wanted in self._journal.read().items():
            if model in self.engines:
                await restore(self.engines[model], self._adapters[model], wanted)
        self._journal.write(self._adapters)

    async def _publish_adapters(self, model: str, names: tuple[str, ...]) -> None:
        await self._publish(lambda seq: wire.Adapters(seq, model, names), "adapter")

    async def _publish(
        self, update: Callable[[int], wire.Adapters | wire.Models], what: str
    ) -> None:
        """Every API process knows the change before the load is answered: a request for the
        new adapter (or model) that reaches any of them right after finds it."""
        seq = next(self._seq)
        waiting = self._acks[seq] = (set(self._peers), asyncio.Event())
        message = update(seq)
        for peer in self._peers:
            self._send(peer, message)
        if not waiting[0]:
            waiting[1].set()
        try:
            # A process that exits meanwhile is let off (`_peer_gone`); its successor learns at
            # Hello. The bound is for one that is alive but stuck.
            await asyncio.wait_for(waiting[1].wait(), ACK_TIMEOUT_S)
        except TimeoutError:
            logger.warning(
                "%s update %d: %d API processes did not answer", what, seq, len(waiting[0])
            )
        finally:
            del self._acks[seq]

    def _acked(self, peer: bytes, seq: int) -> None:
        waiting = self._acks.get(seq)
        if waiting is not None:
            waiting[0].discard(peer)
            if not waiting[0]:
                waiting[1].set()

    # -- what the API processes learn ----------------------------------------------------------

    def _info(self, arena: bool = False) -> wire.Info:
        models = tuple(
            wire.ModelInfo(
                name,
                model.backend.name,
                tuple(model.backend.output_names),
                tuple(sorted(model.backend.sequence_outputs)),
                model.backend.max_concurrency,
                dict(model.outputs.widths),
                model.backend.takes_token_types,
            )
            for name, model in self.encoders.items()
        )
        llms = tuple(
            wire.LLMInfo(
                name,
                engine.max_context_tokens,
                tuple(sorted(engine.sampling_options)),
                engine.max_concurrent_generations,
                tuple(engine.adapter_names()),
            )
            for name, engine in self.engines.items()
        )
        graphs = tuple(
            wire.GraphInfo(
                name,
                model.backend.name,
                model.backend.max_concurrency,
                model.signature,
                model.batch_plan,
                model.default_outputs,
                {output: list(keys) for output, keys in model.class_keys.items()},
                dict(model.backend.metadata),
            )
            for name, model in self.graphs.items()
        )
        return wire.Info(os.getpid(), models, llms, graphs, dict(self._entries), arena)

    def _stats_now(self) -> wire.Stats:
        ready = {name: model.ready for name, model in self.encoders.items()}
        ready |= {name: model.ready for name, model in self.graphs.items()}
        rows = {name: model.fastest_row() for name, model in self.encoders.items()}
        return wire.Stats(
            {name: engine.stats() for name, engine in self.engines.items()},
            ready,
            {name: engine.is_ready() for name, engine in self.engines.items()},
            {name: row for name, row in rows.items() if row is not None},
        )

    async def _report(self) -> None:
        """Model health and engine counters, to every API process (their /metrics read them)."""
        while True:
            await self.registry.ready()  # each model's healthy() sets ferry_model_ready
            stats = self._stats_now()
            for peer in self._peers:
                self._send(peer, stats)
            await asyncio.sleep(STATS_EVERY_S)


def engine_main(
    settings: Settings,
    address: str,
    parent: int | None,
    on_ready: Callable[[], None] | None,
    journal_path: Path,
) -> None:
    """The engine process's entry (multiprocessing spawn target)."""
    configure_logging(settings.log_level, settings.log_format)
    sys.setswitchinterval(settings.gil_switch_interval_ms / 1000)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # SIGTERM from the supervisor, once the API processes have drained.
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        if parent is not None:
            on_parent_exit(parent, stop.set)
        await EngineServer(settings, address, AdapterJournal(journal_path)).run(stop, on_ready)

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return None
    return uvloop.new_event_loop
