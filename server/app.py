"""The app factory: settings in, a FastAPI app out; models start and stop in its lifespan."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from ferry.server.drain import DrainState
from ferry.server.errors import install_error_handlers
from ferry.server.llm_engines import build_llm_engine
from ferry.server.metrics import FerryMetrics, LLMMetricsObserver
from ferry.server.middleware import (
    ApiKeyMiddleware,
    BodySizeLimitMiddleware,
    DrainMiddleware,
    RequestMetricsMiddleware,
)
from ferry.server.openai.serving import OpenAIServing
from ferry.server.registry import ModelRegistry
from ferry.server.routes import (
    embeddings,
    health,
    kserve_v2,
    lora_adapters,
    models,
    openai_chat,
    predict,
)
from ferry.server.routes.head import HeadAsGetMiddleware
from ferry.server.settings import Settings

logger = logging.getLogger(__name__)


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
    metrics = FerryMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = ModelRegistry(settings, metrics)
        app.state.registry = registry
        engines = {m.name: build_llm_engine(m) for m in settings.llm_models}
        app.state.openai = OpenAIServing(engines, observer=app.state.llm_observer)
        await asyncio.gather(registry.start(), *(e.start() for e in engines.values()))
        logger.info("ferry: serving %s", ", ".join([*registry.models, *engines]))
        grpc_server = await start_grpc(app)
        try:
            yield
        finally:
            app.state.drain.begin()
            if grpc_server is not None:
                await grpc_server.stop(settings.drain_timeout_s)
            await registry.close(settings.drain_timeout_s)
            await asyncio.gather(*(e.close() for e in engines.values()), return_exceptions=True)

    app = FastAPI(
        title="Ferry",
        summary="Dynamic micro-batching model server.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.llm_observer = LLMMetricsObserver(metrics)
    app.state.drain = DrainState()
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    app.include_router(predict.router)
    app.include_router(models.router)
    app.include_router(embeddings.router)
    app.include_router(openai_chat.router)
    app.include_router(lora_adapters.router)
    app.include_router(health.router)
    app.include_router(kserve_v2.router)
    # Added innermost first: metrics (outermost) see every response, the 401/413/503s included.
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(DrainMiddleware, drain=app.state.drain)
    if settings.api_key:
        app.add_middleware(
            ApiKeyMiddleware,
            api_key=settings.api_key,
            protect_health=settings.api_key_protects_health,
            protect_metrics=settings.api_key_protects_metrics,
        )
    if settings.cors_allow_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    app.add_middleware(HeadAsGetMiddleware)
    return app
