"""The app factory: settings in, a FastAPI app out; models start and stop in its lifespan."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from server.errors import install_error_handlers
from server.metrics import FerryMetrics
from server.middleware import BodySizeLimitMiddleware, RequestMetricsMiddleware
from server.registry import ModelRegistry
from server.routes import embeddings, health, models, predict
from server.settings import Settings

logger = logging.getLogger(__name__)


def create_app(settings: Settings) -> FastAPI:
    metrics = FerryMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = ModelRegistry(settings, metrics)
        app.state.registry = registry
        await registry.start()
        logger.info("ferry: serving %s", ", ".join(registry.models))
        try:
            yield
        finally:
            app.state.draining = True
            await registry.close(settings.drain_timeout_s)

    app = FastAPI(
        title="Ferry",
        summary="Dynamic micro-batching model server.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.draining = False
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    app.include_router(predict.router)
    app.include_router(models.router)
    app.include_router(embeddings.router)
    app.include_router(health.router)
    # Outermost last: metrics see every response, the 413s included.
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    return app
