"""POST /v1/responses: a thin route over `ferry.server.openai.responses` (the chat path)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ferry.server.openai.responses import create_response, stream_response
from ferry.server.openai.responses_protocol import ResponsesRequest
from ferry.server.routes.openai_chat import ERRORS, STREAM_DOC, _resolve_and_bound, _respond

router = APIRouter()


@router.post("/v1/responses", responses={**ERRORS, **STREAM_DOC})
async def responses(body: ResponsesRequest, request: Request):
    serving = request.app.state.openai
    texts = body.texts()
    served = _resolve_and_bound(request, body.model, "input", texts, len(texts))
    return await _respond(
        request,
        body.stream,
        lambda: create_response(serving, body, served),
        lambda: stream_response(serving, body, served),
    )
