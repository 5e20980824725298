"""`api_servers = N`: start one engine process and N API processes, replace any that dies;
`replicas = N`: N whole servers, no engine process (replicas.py).

As vLLM's `--api-server-count`: the listening socket is created here and handed to every API
process (spawned, so no state is inherited but the socket), which accept from it in turn; the
gRPC port is bound by each with SO_REUSEPORT (grpcio's default). SIGTERM drains every API process
(each answers 503 to new work while its accepted requests finish), then stops the engine; the
supervisor exits 0. A second signal is passed on (the API processes then stop at once).
Replicas are started, replaced and drained as API processes are; one that dies before any was
ever ready stops the server with status 1, as an engine that cannot start does.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from multiprocessing import connection, resource_tracker
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from ferry.server.logs import configure_logging
from ferry.server.procs import run_dir
from ferry.server.procs.arena import arena_prefix, remove_arenas
from ferry.server.procs.metrics_merge import MULTIPROC_ENV, forget_process
from ferry.server.procs.port_role import PortRole
from ferry.server.procs.process_role import ROLE_ENV
from ferry.server.procs.replicas import replica_main
from ferry.server.settings import Settings

logger = logging.getLogger(__name__)
# A restarted engine that dies before it is ready again waits this long before the next try.
RESTART_BACKOFF_S = 1.0
POLL_S = 0.2


def api_main(
    settings: Settings, sock: socket.socket, address: str, arena_prefix: str, role: PortRole
) -> None:
    """An API process: the usual app, its models and engines stand-ins for the engine's."""
    # Its own process group: a terminal's Ctrl-C reaches the supervisor only, which then drains
    # the API processes before it stops the engine.
    os.setpgrp()
    # Received inheritable (SCM_RIGHTS): the processes this one starts (grammar checkers,
    # started by uvloop, which keeps every fd not marked close-on-exec) would hold the port.
    sock.set_inheritable(False)
    configure_logging(settings.log_level, settings.log_format)
    from ferry.server.app import create_app
    from ferry.server.procs.runtimes import EngineConnection
    from ferry.server.serve import serve

    engine = EngineConnection(address, role, arena_prefix)
    serve(create_app(settings, engine), settings, sockets=[sock])


def engine_entry(
    settings: Settings, address: str, parent: int, ready: Any, journal_path: Path
) -> None:
    os.setpgrp()
    from ferry.server.procs.engine_main import engine_main

    engine_main(settings, address, parent, ready.set, journal_path)


class Supervisor:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._context = multiprocessing.get_context("spawn")
        # Before the directory: a port in use leaves nothing behind.
        self._sock = socket.create_server(
            (settings.host, settings.port), backlog=4096, reuse_port=False
        )
        self._dir = run_dir.create()  # removed at exit; a killed run's by the next start
        metrics_dir = os.path.join(self._dir, "metrics")
        os.mkdir(metrics_dir)
        self._metrics_dir = metrics_dir
        # Read by prometheus_client when each child imports it (children inherit the env).
        os.environ[MULTIPROC_ENV] = metrics_dir
        os.environ[run_dir.REGIONS_ENV] = os.path.join(self._dir, "shm_regions")
        self._address = f"ipc://{os.path.join(self._dir, 'engine')}"
        # Each API process's shared memory arena is named by it and this (arena.py).
        self._arena_prefix = arena_prefix(self._dir)
        # The adapters served, kept across engine restarts (adapter_journal.py).
        self._adapter_journal = Path(self._dir) / "adapters.json"
        self._engine: BaseProcess | None = None
        # Set by the engine once its models run; one that never got there the first time failed
        # to start (bad model, bad config): the server stops with status 1, no restart loop.
        self._engine_ready = self._context.Event()
        self._engine_was_ready = False
        self._replicas = settings.replicas > 1  # else API processes in front of an engine
        count = settings.replicas if self._replicas else settings.api_servers
        # Per process on the port, what it serves through; 0: not serving (port_role.py).
        self._serving = self._context.RawArray("i", count)
        self._replica_was_ready = False
        # The API processes, or the replicas: the processes that accept from the socket.
        self._apis: list[BaseProcess | None] = [None] * count
        self._signals = 0

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, self._on_signal)  # a closed terminal: drain, clean up
        # Started before any child, so that it does not inherit a child's FERRY_PROCESS.
        resource_tracker.ensure_running()
        try:
            if not self._replicas:
                self._start_engine()
            for index in range(len(self._apis)):
                self._start_api(index)
            status = self._watch()
            if status:  # the engine (a replica) never started: the others never served, end them
                for process in self._apis:
                    if process is not None:
                        process.kill()
            self._stop()
            return status
        finally:
            self._sock.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            remove_arenas(self._arena_prefix)  # what a killed API process left

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signals += 1
        if self._signals > 1:  # a second signal: pass it on, the API processes stop at once
            for process in self._apis:
                if process is not None and process.pid is not None:
                    _signal(process.pid, signal.SIGTERM)

    def _start_engine(self) -> None:
        self._engine = self._context.Process(
            target=engine_entry,
            args=(
                self._settings,
                self._address,
                os.getpid(),
                self._engine_ready,
                self._adapter_journal,
            ),
            name="ferry-engine",
        )
        with _role("engine"):
            self._engine.start()
        logger.info("engine process %d started", self._engine.pid)

    def _start_api(self, index: int) -> None:
        setting = "replicas" if self._replicas else "api_servers"
        role = PortRole(index, self._serving, os.getpid(), setting)
        if self._replicas:
            process = self._context.Process(
                target=replica_main, args=(self._settings, self._sock, role), name=f"ferry-{index}"
            )
        else:
            process = self._context.Process(
                target=api_main,
                args=(
                    self._settings,
                    self._sock,
                    self._address,
                    self._arena_prefix,
                    role,
                ),
                name=f"ferry-api-{index}",
            )
        kind = "replica" if self._replicas else "api"
        with _role(kind):
            process.start()
        self._apis[index] = process
        what = "replica" if kind == "replica" else "API process"
        logger.info("%s %d started (%d of %d)", what, process.pid, index + 1, len(self._apis))

    def _watch(self) -> int:
        """Until a signal: replace whatever dies. Returns the exit status."""
        while not self._signals:
            children = [p for p in (self._engine, *self._apis) if p is not None]
            connection.wait([p.sentinel for p in children], timeout=POLL_S)
            if self._signals:
                break
            if self._replicas:  # seen while it serves: a later death restarts it
                self._replica_was_ready |= any(self._serving)
            engine = self._engine
            if engine is not None and not engine.is_alive():
                self._reap(engine)
                ready = self._engine_ready.is_set()
                self._engine_was_ready |= ready
                if not self._engine_was_ready:
                    logger.error("the engine process failed to start (status %s)", engine.exitcode)
                    return 1
                logger.error("engine process %d died (%s): restarting", engine.pid, engine.exitcode)
                if not ready:
                    time.sleep(RESTART_BACKOFF_S)
                self._engine_ready.clear()
                self._start_engine()
            for index, process in enumerate(self._apis):
                if process is not None and not process.is_alive():
                    self._reap(process)
                    if self._replicas and not self._replica_died(index, process):
                        return 1
                    self._serving[index] = 0  # the others answer 503 until its successor serves
                    what = "replica" if self._replicas else "API process"
                    logger.error("%s %d died (%s): restarting", what, process.pid, process.exitcode)
                    self._start_api(index)
        return 0

    def _replica_died(self, index: int, process: BaseProcess) -> bool:
        """Whether to start another in its place: not when no replica was ever ready (a bad
        model or config fails them all: status 1, no restart loop)."""
        ready = bool(self._serving[index])
        self._replica_was_ready |= ready
        if not self._replica_was_ready:
            logger.error("a replica failed to start (status %s)", process.exitcode)
            return False
        if not ready:
            time.sleep(RESTART_BACKOFF_S)
        return True

    def _reap(self, process: BaseProcess) -> None:
        process.join()
        assert process.pid is not None
        forget_process(self._metrics_dir, process.pid)
        remove_arenas(self._arena_prefix, process.pid)  # a crashed API process's

    def _stop(self) -> None:
        """Drain the API processes, then stop the engine (it finishes what they handed it)."""
        grace = self._settings.drain_timeout_s + 10
        apis = [p for p in self._apis if p is not None]
        for process in apis:
            if process.is_alive() and process.pid is not None:
                _signal(process.pid, signal.SIGTERM)
        _join_all(apis, grace)
        if self._engine is not None:
            if self._engine.is_alive() and self._engine.pid is not None:
                _signal(self._engine.pid, signal.SIGTERM)
            _join_all([self._engine], grace)


@contextlib.contextmanager
def _role(role: str) -> Iterator[None]:
    """FERRY_PROCESS in the child's environment says which it is (`ps e`, the fault tests)."""
    os.environ[ROLE_ENV] = role
    try:
        yield
    finally:
        del os.environ[ROLE_ENV]


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _join_all(processes: list[BaseProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            logger.error("process %d did not stop in %.0f s: killed", process.pid, timeout_s)
            process.kill()
            process.join()


def run(settings: Settings) -> int:
    return Supervisor(settings).run()
