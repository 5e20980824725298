"""The seam: what serves a request's model, in this process or across the boundary.

With `api_servers = 1` (or in the engine process) the registry and LLM engines are the real
ones, as always. In an API process (given an `EngineConnection` by its entry point) they are the
stand-ins of `remote`, connected to the engine process, and metrics merge across processes.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from ferry.server.kserve.shared_memory import LocalRegions, RegionStore, SharedRegions
from ferry.server.metrics import FerryMetrics
from ferry.server.procs.arena import Arena
from ferry.server.procs.metrics_merge import MULTIPROC_ENV, MergedRegistry
from ferry.server.procs.port_role import PortRole
from ferry.server.procs.run_dir import REGIONS_ENV
from ferry.server.registry import ModelRegistry
from ferry.server.settings import Settings


@dataclass(frozen=True)
class EngineConnection:
    """An API process's role (`api_servers > 1`): the engine process it serves through, and the
    supervisor that started both. None in its place: everything runs in this process."""

    address: str  # the engine's ZMQ address
    role: PortRole  # its place on the port (and its supervisor), marked while it is connected
    arena_prefix: str = ""  # its shared memory arena's name, less this process's pid (arena.py)


def region_store(shared: bool) -> RegionStore:
    """Shared memory registrations: in the supervisor's run dir when processes share a port (a
    region registered through one is used through another), else in this process."""
    path = os.environ.get(REGIONS_ENV)
    return SharedRegions(Path(path)) if shared and path else LocalRegions()


def metrics_registry(shared: bool) -> CollectorRegistry | None:
    """`shared`: a process that answers /metrics for all (an API process, a replica)."""
    path = os.environ.get(MULTIPROC_ENV)
    return MergedRegistry(path) if shared and path else None


async def build_runtimes(
    settings: Settings, metrics: FerryMetrics, engine: EngineConnection | None
) -> ModelRegistry:
    """The model registry (encoders and LLM engines), not yet started."""
    if engine is None:
        return ModelRegistry.local(settings, metrics)
    from ferry.server.procs.client import EngineClient
    from ferry.server.procs.parent import on_parent_exit
    from ferry.server.procs.remote import connect

    # A killed supervisor: drain and stop, as on SIGTERM.
    on_parent_exit(engine.role.supervisor_pid, lambda: os.kill(os.getpid(), signal.SIGTERM))
    arena = None
    if engine.arena_prefix:
        arena = Arena.create(
            engine.arena_prefix, settings.engine_shm_arena_bytes, settings.engine_shm_min_bytes
        )
    client = EngineClient(
        engine.address,
        settings.engine_heartbeat_timeout_s,
        settings.engine_window_bytes,
        metrics.engine_unanswered,
        arena,
        (metrics.engine_shm_used, metrics.engine_shm_fallbacks),
        engine.role.mark,
    )
    return await connect(settings, client, metrics)
