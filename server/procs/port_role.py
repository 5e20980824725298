"""A process's place among those that accept from the server's one port: `replicas = N` whole
servers, or `api_servers = N` API processes in front of one engine. Its own module, so the app
and its services can name it without importing the entry points, which import the app.

Readiness is the server's, not a process's: a load balancer's probe reaches one process and its
next request another, so each answers /health/ready with 200 only while every one of them
serves the same way. Each writes what it serves through in an int shared with all (one per
process, written by it and by the supervisor, which zeroes a dead one's): a replica 1 once its
models are started, an API process the pid of the engine it is connected to, 0 when that engine
stops. After an engine restart each API process reconnects on its own time; one still on the
old engine's pid (it has not seen the death yet) or on 0 would answer 503, so until every one
writes the new pid none says ready.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PortRole:
    """Its index, what every process serves through (multiprocessing's RawArray("i", N)), the
    supervisor that started it, and the setting that made N processes (readiness names it)."""

    index: int
    serving: Any
    supervisor_pid: int
    setting: str  # "replicas" or "api_servers"

    def started(self) -> None:
        """A replica's models started: it serves. Stops (drains) when the supervisor is killed
        (an API process watches it from its start: procs/runtimes.py)."""
        from ferry.server.procs.parent import on_parent_exit

        on_parent_exit(self.supervisor_pid, lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.mark(REPLICA_SERVING)

    def mark(self, serving_through: int) -> None:
        """A replica: REPLICA_SERVING; an API process: its engine's pid; 0: not serving."""
        self.serving[self.index] = serving_through

    def count(self) -> tuple[int, int]:
        """(processes serving as this one does, processes); 0 of them while it does not."""
        marks = self.serving[:]
        own = marks[self.index]
        return (marks.count(own) if own else 0), len(marks)


REPLICA_SERVING = 1
