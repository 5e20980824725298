"""The app factory: settings in, a FastAPI app out; models start and stop in its lifespan."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from ferry.server.drain import DrainState
from ferry.server.encoder import EncoderServing
from ferry.server.errors import install_error_handlers
from ferry.server.gateway import Gateway
from ferry.server.hot import HotRoutes
from ferry.server.llm_engines import build_llm_engine
from ferry.server.metrics import FerryMetrics, LLMMetricsObserver
from ferry.server.openai.serving import OpenAIServing
from ferry.server.registry import ModelRegistry
from ferry.server.routes import (
    embeddings,
    health,
    kserve_v2,
    lora_adapters,
    models,
    openai_chat,
    openai_responses,
    predict,
)
from ferry.server.settings import Settings

logger = logging.getLogger(__name__)
# The framework's routers (the hot routes register themselves): the gateway learns their POST
# paths from here, to refuse bodies not declared JSON there and nowhere else.
ROUTERS = (
    models.router,
    openai_chat.router,
    openai_responses.router,
    lora_adapters.router,
    health.router,
    kserve_v2.router,
)


async def start_grpc(app: FastAPI):
    settings = app.state.settings
    if settings.grpc_port is None:
        return None
    # grpcio and the proto come with tritonclient[grpc], needed only when gRPC is on.
    from ferry.server.kserve.grpc_service import start_grpc_server

    return await start_grpc_server(
        app.state, settings.host, settings.grpc_port, settings.max_body_bytes
    )


def create_app(settings: Settings) -> FastAPI:
    metrics = FerryMetrics(priority_levels=settings.priority_levels)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engines = {m.name: build_llm_engine(m) for m in settings.llm_models}
        registry = ModelRegistry.from_settings(settings, metrics, engines)
        app.state.registry = registry
        app.state.openai = OpenAIServing(registry, observer=LLMMetricsObserver(metrics))
        metrics.watch_llm_engines(registry.engine_stats)  # read when Prometheus scrapes
        await registry.start()
        logger.info("ferry: serving %s", ", ".join(registry.names()))
        grpc_server = await start_grpc(app)
        try:
            yield
        finally:
            app.state.drain.begin()
            if grpc_server is not None:
                await grpc_server.stop(settings.drain_timeout_s)
            await registry.close(settings.drain_timeout_s)

    app = FerryAPI(
        title="Ferry",
        summary="Dynamic micro-batching model server.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.drain = DrainState()
    app.state.started_at = int(time.time())
    app.state.encoder = EncoderServing(settings)
    install_error_handlers(app)
    hot = HotRoutes()
    predict.register(app.router, hot)
    embeddings.register(app.router, hot)
    kserve_v2.register(app.router, hot)
    for router in ROUTERS:
        app.include_router(router)
    app.outer_layers = lambda inner: _outer_layers(inner, app, settings, hot)
    return app


class FerryAPI(FastAPI):
    """FastAPI with Ferry's gateway outside the framework's own layers (server error, telemetry,
    body limit): hot routes never pass through them, every other request still does."""

    outer_layers: Callable[[ASGIApp], ASGIApp] = staticmethod(lambda inner: inner)

    def build_middleware_stack(self) -> ASGIApp:
        return self.outer_layers(super().build_middleware_stack())


def _outer_layers(inner: ASGIApp, app: FastAPI, settings: Settings, hot: HotRoutes) -> ASGIApp:
    # The gateway sees every request and answers the 401/413/503s itself.
    outer: ASGIApp = Gateway(
        inner,
        settings=settings,
        metrics=app.state.metrics,
        drain=app.state.drain,
        hot=hot,
        state=app.state,
        post_paths=frozenset(
            route.path
            for router in ROUTERS
            for route in router.routes
            if "POST" in getattr(route, "methods", ())
        ),
    )
    if settings.cors_allow_origins:
        # Outside the gateway, so that hot routes' answers carry the CORS headers too.
        outer = CORSMiddleware(
            outer,
            allow_origins=list(settings.cors_allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return outer
