"""A replica's place in the server (`replicas = N`, replicas.py): its own module, so the app and
its services can name it without importing the replica's entry point, which imports the app."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplicaRole:
    """A replica's place in the server: its index, every replica's serving flag (a shared
    byte array, one per replica: 1 while it serves) and the supervisor that started it."""

    index: int
    serving: Any  # multiprocessing's RawArray("b", N), written by each replica and the supervisor
    supervisor_pid: int

    def started(self) -> None:
        """Models started: this replica serves. Stops (drains) when the supervisor is killed."""
        from ferry.server.procs.parent import on_parent_exit

        on_parent_exit(self.supervisor_pid, lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.serving[self.index] = 1

    def stopping(self) -> None:
        self.serving[self.index] = 0

    def count(self) -> tuple[int, int]:
        """(replicas serving, replicas)."""
        flags = self.serving[:]
        return sum(flags), len(flags)
