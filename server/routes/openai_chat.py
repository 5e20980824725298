"""POST /v1/chat/completions and /v1/completions: thin routes over `ferry.server.openai.serving`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from ferry.batcher.errors import InvalidInput
from ferry.server.disconnect import ClientDisconnected, run_unless_disconnected
from ferry.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
)
from ferry.server.registry import ServedModel
from ferry.server.schemas import error_responses

router = APIRouter()

ERRORS = error_responses(400, 401, 404, 413, 415, 429, 500, 503)
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


def _resolve_and_bound(
    request: Request, model: str, field: str, texts: Sequence[str | list[int]], items: int
) -> ServedModel:
    """The request's model, looked up once (UnknownModel) and kept as the metrics label (a
    configured name only); bounds checked before tokenizing, errors naming `field[i]`."""
    served = request.app.state.openai.resolve(model)
    request.state.model_name = served.name
    settings = request.app.state.settings
    if items > settings.max_items_per_request:
        raise InvalidInput(field, f"{items} items; at most {settings.max_items_per_request}")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            continue  # token ids: checked against the vocabulary and context by the serving layer
        if len(text) > settings.max_chars_per_text:
            raise InvalidInput(
                f"{field}[{index}]",
                f"{len(text)} characters; at most {settings.max_chars_per_text}",
            )
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput(
                    f"{field}[{index}]", "text is not valid Unicode (lone surrogate)"
                ) from None
    return served


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={**ERRORS, **STREAM_DOC},
)
async def chat_completions(body: ChatCompletionRequest, request: Request):
    serving = request.app.state.openai
    texts = [m.text for m in body.messages]
    served = _resolve_and_bound(request, body.model, "messages", texts, len(body.messages))
    return await _respond(
        request,
        body.stream,
        lambda: serving.chat(body, served),
        lambda: serving.chat_stream(body, served),
    )


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={**ERRORS, **STREAM_DOC},
)
async def completions(body: CompletionRequest, request: Request):
    serving = request.app.state.openai
    prompts = body.prompts()
    served = _resolve_and_bound(request, body.model, "prompt", prompts, len(prompts))
    return await _respond(
        request,
        body.stream,
        lambda: serving.completion(body, served),
        lambda: serving.completion_stream(body, served),
    )
