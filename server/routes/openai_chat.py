"""POST /v1/chat/completions and /v1/completions: thin routes over `ferry.server.openai.serving`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from ferry.server.disconnect import ClientDisconnected, run_unless_disconnected
from ferry.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
)
from ferry.server.schemas import error_responses

router = APIRouter()

ERRORS = error_responses(400, 401, 404, 413, 429, 500, 503)
STREAM_DOC = {200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE chunks"}}


async def _respond(
    request: Request,
    stream: bool,
    full: Callable[[], Awaitable[object]],
    streamed: Callable[[], Awaitable[AsyncIterator[str]]],
) -> object:
    if stream:
        # Errors before the first byte (unknown model, prompt too long, overload) are raised
        # here and answered with a status; later ones travel in the stream. Starlette cancels
        # the iterator when the client disconnects, which aborts the generation.
        events = await streamed()
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    try:
        return await run_unless_disconnected(request, full())
    except ClientDisconnected:
        return Response(status_code=499)


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={**ERRORS, **STREAM_DOC},
)
async def chat_completions(body: ChatCompletionRequest, request: Request):
    request.state.model_name = body.model
    serving = request.app.state.openai
    return await _respond(
        request, body.stream, lambda: serving.chat(body), lambda: serving.chat_stream(body)
    )


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={**ERRORS, **STREAM_DOC},
)
async def completions(body: CompletionRequest, request: Request):
    request.state.model_name = body.model
    serving = request.app.state.openai
    return await _respond(
        request,
        body.stream,
        lambda: serving.completion(body),
        lambda: serving.completion_stream(body),
    )
