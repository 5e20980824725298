"""The supervisor's temporary directory (`/tmp/ferry-*`: the engine socket, the multiprocess
metric files, the adapter journal, the shared memory registrations), and the removal of those a
crashed run left behind, with the API processes' arenas (`/dev/shm/<its name>-arena-*`,
arena.py).

The supervisor removes its own on every exit it lives through (normal, SIGTERM, SIGINT, SIGHUP,
an exception). One that is killed (SIGKILL, the OOM killer) cannot: each directory names its
owner (pid and start time, so a reused pid is not mistaken for it), and the next start removes
those whose owner is gone.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
from pathlib import Path

from ferry.server.procs.arena import arena_prefix, remove_arenas

logger = logging.getLogger(__name__)
PREFIX = "ferry-"
OWNER = "owner"
# Set by the supervisor for its children: the directory of shared memory registrations
# (server/kserve/shared_memory.py), which every API process or replica reads.
REGIONS_ENV = "FERRY_SHM_REGIONS"


def create() -> str:
    """A new directory, owned by this process; leftovers of dead runs are removed first."""
    remove_leftovers()
    path = tempfile.mkdtemp(prefix=PREFIX)
    Path(path, OWNER).write_text(_identity(os.getpid()) or "")
    return path


def remove_leftovers(parent: str | None = None) -> list[str]:
    """Remove every `ferry-*` directory whose owner has exited; returns those removed."""
    removed = []
    for path in glob.glob(os.path.join(parent or tempfile.gettempdir(), PREFIX + "*")):
        try:
            owner = Path(path, OWNER).read_text().split()
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue  # not one of ours, or another user's
        if len(owner) != 2 or not owner[0].isdigit() or _identity(int(owner[0])) == " ".join(owner):
            continue  # its owner still runs
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path):  # not ours to remove after all (another user's files in it)
            continue
        remove_arenas(arena_prefix(path))
        removed.append(path)
        logger.info("removed %s, left by process %s", path, owner[0])
    return removed


def _identity(pid: int) -> str | None:
    """`pid starttime` while the process runs (not a zombie), else None."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] not in ("Z", "X"):
            return f"{pid} {fields[19]}"  # field 22 of stat: start time in clock ticks
    return None
