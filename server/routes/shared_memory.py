"""Triton's shared memory extension over HTTP: system shared memory regions registered, listed
and unregistered per tenant (`kserve/shared_memory.py` holds them); CUDA shared memory answered
"not supported" on every one of its routes, naming what to use instead."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from ferry.server.errors import MalformedRequest, NotSupported
from ferry.server.kserve.shared_memory import CUDA_UNSUPPORTED, SharedMemory
from ferry.server.routes.kserve_v2 import error_docs
from ferry.server.services import services_of

router = APIRouter(prefix="/v2", tags=["kserve-v2"])
SYSTEM = "/systemsharedmemory"
CUDA = "/cudasharedmemory"


def _shared_memory(request: Request) -> tuple[SharedMemory, str | None]:
    return services_of(request).shared_memory, getattr(request.state, "tenant", None)


@router.get(f"{SYSTEM}/status", responses=error_docs(401, 403))
@router.get(f"{SYSTEM}/region/{{name}}/status", responses=error_docs(400, 401, 403))
async def system_status(request: Request, name: str | None = None) -> Response:
    regions, tenant = _shared_memory(request)
    return JSONResponse(regions.status(tenant, name))


@router.post(f"{SYSTEM}/region/{{name}}/register", responses=error_docs(400, 401, 403))
async def system_register(name: str, request: Request) -> Response:
    regions, tenant = _shared_memory(request)
    regions.register(tenant, name, _object(await request.body()))
    return JSONResponse({})


@router.post(f"{SYSTEM}/unregister", responses=error_docs(401, 403))
@router.post(f"{SYSTEM}/region/{{name}}/unregister", responses=error_docs(401, 403))
async def system_unregister(request: Request, name: str | None = None) -> Response:
    regions, tenant = _shared_memory(request)
    regions.unregister(tenant, name)
    return JSONResponse({})


# No CUDA region is ever registered: the status lists none and unregistering is a no-op (what
# Triton's examples do first, to start clean); registering, or asking for a region, is refused.
@router.get(f"{CUDA}/status")
async def cuda_status() -> Response:
    return JSONResponse([])


@router.post(f"{CUDA}/unregister")
@router.post(f"{CUDA}/region/{{name}}/unregister", include_in_schema=False)
async def cuda_unregister() -> Response:
    return JSONResponse({})


@router.get(f"{CUDA}/region/{{name}}/status", responses=error_docs(400))
@router.post(f"{CUDA}/region/{{name}}/register", responses=error_docs(400))
async def cuda_register(name: str) -> Response:  # the path's name, declared for the schema
    raise NotSupported("cuda_shared_memory", CUDA_UNSUPPORTED)


def _object(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MalformedRequest("the body must be a JSON object {key, offset, byte_size}") from None
    if not isinstance(value, dict):
        raise MalformedRequest("the body must be a JSON object {key, offset, byte_size}")
    return value
