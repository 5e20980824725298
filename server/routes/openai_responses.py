"""POST /v1/responses: a thin hot route over `ferry.server.openai.responses` (the chat path)."""

from __future__ import annotations

from fastapi import APIRouter

from ferry.server.call_tenancy import run_as
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.openai.responses import create_response, stream_response
from ferry.server.openai.responses_protocol import ResponsesRequest
from ferry.server.replies import Reply, Stream
from ferry.server.request_bodies import parse_body
from ferry.server.routes.openai_chat import (
    ERRORS,
    STREAM_DOC,
    check_text,
    resolve_and_bound,
    respond,
)
from ferry.server.tenancy import DEFAULT_PRIORITY


async def responses(call: HotCall) -> Reply | Stream:
    body = await parse_body(ResponsesRequest, call.body)
    serving = call.services.openai
    texts = body.texts()
    served = resolve_and_bound(call, body.model, "input", texts, len(texts))
    if body.instructions:
        check_text(call, "instructions", body.instructions)
    tenant = run_as(call, DEFAULT_PRIORITY, body.cache_salt)  # Responses have no priority
    return await respond(
        body.stream,
        lambda: create_response(serving, body, served, tenant),
        lambda: stream_response(serving, body, served, tenant),
    )


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    register(
        router,
        hot,
        "/v1/responses",
        responses,
        summary="Responses",
        responses={**ERRORS, **STREAM_DOC},
        body_model=ResponsesRequest,
    )
