"""Triton's model repository extension over HTTP: POST /v2/repository/index, and
/v2/repository/models/{name}/load and /unload (server/model_repository.py does the work).

Bodies as tritonclient sends them: none for the index (or `{"ready": true}`), and
`{"parameters": {...}}` or none for a load or unload; errors in KServe's `{"error": "..."}`.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ferry.server.errors import MalformedRequest
from ferry.server.json_errors import json_error
from ferry.server.model_repository import (
    check_tenant_right,
    load_parameters,
    unload_parameters,
)
from ferry.server.routes.kserve_v2 import error_docs
from ferry.server.services import services_of

router = APIRouter(prefix="/v2/repository", tags=["kserve-v2"])
FORBIDDEN_DOC = {"description": "model_control_mode is not explicit, or the key may not"}
READY_NOT_BOOLEAN = "Invalid value for 'ready': expected a boolean"  # Triton's words


class IndexEntryModel(BaseModel):
    name: str
    version: str | None = None
    state: str | None = None
    reason: str | None = None


@router.post(
    "/index",
    response_model=list[IndexEntryModel],
    response_model_exclude_none=True,
    responses=error_docs(400, 401),
)
async def repository_index(request: Request) -> Response:
    try:
        body = await _body(request)
    except MalformedRequest as exc:
        if exc.field is None or exc.field.partition("[")[0] != "ready":
            raise
        # Its value could not be read (an array nested past the parser's limit, a broken
        # literal): whatever it held, not a boolean.
        raise MalformedRequest(f"{READY_NOT_BOOLEAN} ({exc})", "ready") from None
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise MalformedRequest(READY_NOT_BOOLEAN, "ready")
    unknown = sorted(set(body) - {"ready"})
    if unknown:
        raise MalformedRequest(f"'{unknown[0]}' is not an index field (ready)", unknown[0])
    entries = await services_of(request).repository.index(ready)
    return JSONResponse([entry.as_json() for entry in entries])


@router.post(
    "/models/{name}/load", responses={**error_docs(400, 401, 404, 500), 403: FORBIDDEN_DOC}
)
async def load_model(name: str, request: Request) -> Response:
    check_control_right(request)
    config, files = load_parameters(name, _parameters(await _body(request)))
    await services_of(request).repository.load(name, config, files)
    return Response(status_code=200)


@router.post("/models/{name}/unload", responses={**error_docs(400, 401, 404), 403: FORBIDDEN_DOC})
async def unload_model(name: str, request: Request) -> Response:
    check_control_right(request)
    dependents = unload_parameters(name, _parameters(await _body(request)))
    await services_of(request).repository.unload(name, dependents)
    return Response(status_code=200)


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object of the body; {} for none (tritonclient's index request)."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        field, message = json_error(raw, str(exc))
        raise MalformedRequest(f"request is not valid JSON: {message}", field) from None
    if not isinstance(body, dict):
        raise MalformedRequest("the body must be a JSON object")
    return body


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(body) - {"parameters"})
    if unknown:
        raise MalformedRequest(f"'{unknown[0]}' is not a field here (parameters)", unknown[0])
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise MalformedRequest("'parameters' must be an object", "parameters")
    return parameters


def check_control_right(request: Request) -> None:
    check_tenant_right(services_of(request).settings, getattr(request.state, "tenant", None))
