"""How many worker processes a pool of the server's gets by default: one fewer than the cores
this process may run on (at least one), so the event loop keeps a core."""

from __future__ import annotations

import os


def default_workers() -> int:
    """One fewer than the cores this process may run on, at least one: the loop keeps a core."""
    return max(1, available_cores() - 1)


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # a container's or taskset's share, not the host's
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
