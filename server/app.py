"""The app factory: settings in, a FastAPI app out; models start and stop in its lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from ferry import __version__
from ferry.server import json_bodies
from ferry.server.dialects import ErrorDialect, install_error_handlers
from ferry.server.gateway import Gateway
from ferry.server.hot import HotRoutes
from ferry.server.metrics import FerryMetrics, LLMMetricsObserver
from ferry.server.model_repository import ModelRepository
from ferry.server.openai.grammars import start_grammars
from ferry.server.openai.serving import OpenAIServing
from ferry.server.openapi_statuses import document_invalid_statuses
from ferry.server.procs.port_role import PortRole
from ferry.server.procs.runtimes import (
    EngineConnection,
    build_runtimes,
    metrics_registry,
    region_store,
)
from ferry.server.progress import loading_progress
from ferry.server.registry import ModelRegistry
from ferry.server.route_table import HTTP_ROUTES
from ferry.server.routes import (
    anthropic_messages,
    console,
    embeddings,
    health,
    kserve_v2,
    lora_adapters,
    model_repository,
    models,
    openai_chat,
    openai_responses,
    predict,
    rerank,
    shared_memory,
    tokenize,
)
from ferry.server.services import Models, Services, app_services, build_services, install
from ferry.server.settings import Settings
from ferry.server.worker_cores import share_cores

logger = logging.getLogger(__name__)
# What each route is (class, key, body types, dialect) is declared in route_table.py; these
# modules mount the handlers. The framework's routers:
ROUTERS = (
    models.router,
    lora_adapters.router,
    health.router,
    kserve_v2.router,
    shared_memory.router,
    model_repository.router,
)
# Hot routes: registered with the gateway's dispatch (and documented in the framework's schema).
HOT_ROUTES = (
    predict,
    embeddings,
    rerank,
    tokenize,
    openai_chat,
    openai_responses,
    anthropic_messages,
    kserve_v2,
)


async def start_grpc(services: Services) -> Any:  # a grpc.aio.Server, or None when gRPC is off
    settings = services.settings
    if settings.grpc_port is None:
        return None
    # grpcio and the proto come with tritonclient[grpc], needed only when gRPC is on.
    from ferry.server.kserve.grpc_service import start_grpc_server

    return await start_grpc_server(
        services, settings.host, settings.grpc_port, settings.max_body_bytes
    )


async def start_models(registry: ModelRegistry, loads_here: bool) -> None:
    """Start every model, with progress where they load (not in an API process)."""
    if not loads_here:
        await registry.start()
        return
    with loading_progress(registry.loads()) as progress:
        await registry.start(progress)


def create_app(
    settings: Settings,
    engine: EngineConnection | None = None,
    replica: PortRole | None = None,
) -> FerryAPI:
    """`engine`: an API process's (`api_servers > 1`), whose models run in the engine process;
    None serves them here. `replica`: one of `replicas > 1` whole servers on one port."""
    shared = engine is not None or replica is not None  # /metrics: every process's series
    # Each API process or replica starts its own worker pools: its share of the cores (the two
    # layouts exclude each other, so the larger count is the one in use).
    share_cores(max(settings.api_servers, settings.replicas) if shared else 1)
    metrics = FerryMetrics(metrics_registry(shared), priority_levels=settings.priority_levels)
    port_role = replica if engine is None else engine.role
    services = build_services(settings, metrics, region_store(shared), port_role)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = await build_runtimes(settings, metrics, engine)
        grammars, grammar_pool = await start_grammars(settings)
        observer = LLMMetricsObserver(metrics)
        openai = OpenAIServing(registry, observer=observer, grammars=grammars)
        metrics.watch_llm_engines(registry.engine_stats)  # read when Prometheus scrapes
        await start_models(registry, loads_here=engine is None)
        repository = ModelRepository(settings, registry, metrics)
        services.start(Models(registry, openai, repository))
        repository.start(poll=engine is None)  # else the engine process polls
        logger.info("ferry: serving %s", ", ".join(registry.names()))
        grpc_server = await start_grpc(services)
        if replica is not None:
            replica.started()
        try:
            yield
        finally:
            if port_role is not None:
                port_role.mark(0)
            services.drain.begin()
            await repository.close()
            if grpc_server is not None:
                await grpc_server.stop(settings.drain_timeout_s)
            await registry.close(settings.drain_timeout_s)
            if grammar_pool is not None:
                await grammar_pool.close()
            await json_bodies.shutdown()
            if services.tracing is not None:
                # Exports the spans still buffered (blocking: off the loop).
                await asyncio.to_thread(services.tracing.shutdown)

    hot = HotRoutes()
    app = FerryAPI(
        hot,
        title="Ferry",
        summary="Dynamic micro-batching model server.",
        version=__version__,
        lifespan=lifespan,
        # Ferry traces and counts every route itself (server/otel_tracing.py, metrics); FastAPI's
        # own telemetry asked OpenTelemetry's global providers on every request (~3 % of the
        # event loop on a one-row tabular model) to find them unset.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    install(app, services)
    install_error_handlers(app, HTTP_ROUTES.dialect_of)
    for module in HOT_ROUTES:
        module.register_routes(app.router, hot)
    for router in ROUTERS:
        app.include_router(router)
    if settings.console:
        app.include_router(console.router)
    return app


class FerryAPI(FastAPI):
    """FastAPI with Ferry's gateway outside the framework's own layers (server error, telemetry,
    body limit): hot routes never pass through them, every other request still does."""

    def __init__(self, hot: HotRoutes, **kwargs: object) -> None:
        self.hot = hot
        super().__init__(**kwargs)  # type: ignore[arg-type]  # FastAPI's own keywords, passed on

    def build_middleware_stack(self) -> ASGIApp:
        # Built at the first request, once every route is registered.
        return _outer_layers(super().build_middleware_stack(), self)

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            document_invalid_statuses(super().openapi(), _dialect_of)
        return self.openapi_schema  # type: ignore[return-value]  # set by super().openapi() above


def _dialect_of(method: str, path: str) -> ErrorDialect:
    # One route per path in the table; a template such as /v2/models/{name}/infer is its own.
    return HTTP_ROUTES.dialect_of(path)


def _outer_layers(inner: ASGIApp, app: FerryAPI) -> ASGIApp:
    # The gateway sees every request and answers the 401/413/503s itself.
    services = app_services(app)
    settings = services.settings
    outer: ASGIApp = Gateway(inner, services, app.hot)
    if settings.cors_allow_origins:
        # Outside the gateway, so that hot routes' answers carry the CORS headers too.
        outer = CORSMiddleware(
            outer,
            allow_origins=list(settings.cors_allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "X-Request-Id",
                "Traceparent",
                "Tracestate",
            ],
            expose_headers=["X-Request-Id", "Traceresponse"],
        )
    return outer
