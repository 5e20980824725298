"""The server's worker process pools: how many workers by default (one fewer than the cores
this process may run on, at least one, so the event loop keeps a core), and how they start.

Each API process (`api_servers`) or replica starts pools of its own (JSON bodies, image
decoding), so each takes its share of those cores: four API processes on 16 cores made 60 body
workers where 15 were meant (`share_cores`, set at start-up)."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.context import BaseContext

_sharing = 1  # the server's processes that each start pools of their own


def share_cores(processes: int) -> None:
    """This process is one of `processes` that each start their own pools (the app's start)."""
    global _sharing
    _sharing = max(1, processes)


def default_workers() -> int:
    """One fewer than the cores this process may run on, at least one: the loop keeps a core;
    split between the processes that share them (`share_cores`)."""
    return max(1, (available_cores() - 1) // _sharing)


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # a container's or taskset's share, not the host's
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker_context(preload: str) -> BaseContext:
    """Workers forked from a server process that imported only `preload`, where the platform
    has one: never forked from this threaded process, and started in milliseconds, not the
    second a fresh interpreter takes to import numpy."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([preload])
    return context
