"""The server's readiness, as every probe answers it (/health/ready, /health, /v2/health/ready)."""

from __future__ import annotations

from dataclasses import dataclass

from ferry.server.services import Services


@dataclass(frozen=True)
class Readiness:
    ready: bool
    status: str  # "ready", "starting" or "draining"
    detail: dict[str, object]  # each model's readiness; with N processes on the port, theirs


async def server_readiness(services: Services) -> Readiness:
    """Ready: every model ready, every process on the port serving, and not draining."""
    started = services.models is not None  # before the lifespan built them: starting
    models = services.registry.readiness() if started else {}
    ready = started and all(models.values()) and await services.registry.ready()
    detail: dict[str, object] = {"models": models}
    role = services.port_role
    if role is not None:  # a probe reaches one process, the next request perhaps another
        serving, total = role.count()
        ready = ready and serving == total
        detail[role.setting] = {"ready": serving, "total": total}
    draining = services.drain.draining
    ok = ready and not draining
    return Readiness(ok, "ready" if ok else ("draining" if draining else "starting"), detail)
