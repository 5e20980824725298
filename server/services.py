"""What the request path is served by, typed: the registry, settings, metrics, drain and the rest.

`create_app` builds one `Services` and stores it on the app; the framework's routes read it with
`services_of(request)`, the gateway hands it to the hot routes (`HotCall.services`) and the gRPC
servicer is given it. Nothing on the request path reads them from the framework's untyped state.
The models (registry, OpenAI serving, repository) are built by the lifespan, before the first
request: `start` sets them once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ferry.server.drain import DrainState
from ferry.server.encoder import EncoderServing
from ferry.server.kserve.shared_memory import RegionStore, SharedMemory
from ferry.server.metrics import FerryMetrics
from ferry.server.settings import Settings
from ferry.server.tenancy import PriorityPolicy
from ferry.server.tracing import start_tracing

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request

    from ferry.server.model_repository import ModelRepository
    from ferry.server.openai.serving import OpenAIServing
    from ferry.server.otel_tracing import Tracing
    from ferry.server.procs.port_role import PortRole
    from ferry.server.registry import ModelRegistry


class NotStarted(RuntimeError):
    """A model service read before the lifespan built it (a bug: no request comes before)."""


@dataclass(frozen=True)
class Models:
    """What the lifespan builds: the served models and what serves through them."""

    registry: ModelRegistry
    openai: OpenAIServing
    repository: ModelRepository


@dataclass
class Services:
    settings: Settings
    metrics: FerryMetrics
    drain: DrainState
    encoder: EncoderServing
    shared_memory: SharedMemory
    priority_policy: PriorityPolicy
    tracing: Tracing | None  # None: off, the SDK not imported
    # One of N processes on the port (replicas, or API processes); None: the only one.
    port_role: PortRole | None
    started_at: int  # seconds since the epoch: the models' `created`
    models: Models | None = field(default=None, repr=False)  # None until the lifespan's `start`

    def start(self, models: Models) -> None:
        self.models = models

    @property
    def registry(self) -> ModelRegistry:
        return self._started().registry

    @property
    def openai(self) -> OpenAIServing:
        return self._started().openai

    @property
    def repository(self) -> ModelRepository:
        return self._started().repository

    def _started(self) -> Models:
        if self.models is None:
            raise NotStarted("the models are not built yet (the app's lifespan has not started)")
        return self.models


def build_services(
    settings: Settings,
    metrics: FerryMetrics,
    regions: RegionStore,
    port_role: PortRole | None = None,
) -> Services:
    """The services known before the models start; `regions`: where shared memory registrations
    live (procs/runtimes.py's `region_store`)."""
    return Services(
        settings=settings,
        metrics=metrics,
        tracing=start_tracing(settings),
        drain=DrainState(),
        encoder=EncoderServing(settings),
        shared_memory=SharedMemory(regions, settings.allow_client_shm),
        priority_policy=PriorityPolicy(settings.priority_keys, settings.priority_below_default),
        port_role=port_role,
        started_at=int(time.time()),
    )


def install(app: Starlette, built: Services) -> None:
    """The one place the services are stored on the app."""
    app.state.services = built


def app_services(app: Starlette) -> Services:
    """The app's services (stored by `install`): the one place they are read from it."""
    found = app.state.services
    if not isinstance(found, Services):
        raise TypeError("the app has no Ferry services (not built by create_app)")
    return found


def services_of(request: Request) -> Services:
    """The services of the app serving `request` (a framework route's)."""
    return app_services(request.app)
