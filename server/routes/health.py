"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS

from ferry.server.metrics import ServedSeries
from ferry.server.readiness import server_readiness
from ferry.server.services import services_of

router = APIRouter()


# The gateway answers this itself (gateway.py); the route documents it.
LIVE = {"status": "alive"}


@router.get("/health/live")
async def live() -> dict[str, str]:
    return LIVE


NOT_READY: dict[int | str, dict[str, Any]] = {
    503: {"description": "Starting or draining; see Retry-After"}
}


@router.get("/health/ready", responses=NOT_READY)
async def ready(request: Request) -> JSONResponse:
    return await readiness(request)


# vLLM's and TGI's probe (guidellm and other OpenAI-side tools ask it first): 200 once every model
# is ready, as /health/ready answers.
@router.get("/health", responses=NOT_READY)
async def health(request: Request) -> JSONResponse:
    return await readiness(request)


async def readiness(request: Request) -> JSONResponse:
    state = await server_readiness(services_of(request))
    return JSONResponse(
        {"status": state.status, **state.detail},
        status_code=200 if state.ready else 503,
        headers=None if state.ready else {"Retry-After": "1"},
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {}, OPENMETRICS.split(";")[0]: {}},
            "description": "Metrics: Prometheus text, or OpenMetrics when the Accept header asks",
        }
    },
)
async def metrics(request: Request) -> Response:
    services = services_of(request)
    # Negotiated as prometheus_client's own server does (`Accept: application/openmetrics-text`).
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    models = services.models  # None until the models are built
    shown = services.metrics.current()
    if models is not None:  # only served names as label values (ServedSeries)
        # Typed for a registry, the encoders only call `collect()`, which ServedSeries has.
        shown = cast(CollectorRegistry, ServedSeries(shown, models.registry.names()))
    return Response(encoder(shown), headers={"Content-Type": content_type})
