"""POST /v1/chat/completions and /v1/completions: thin hot routes over `openai.serving`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from ferry.server.call_tenancy import run_as
from ferry.server.errors import InvalidInput
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
)
from ferry.server.registry import ServedLLM
from ferry.server.replies import Reply, Stream, json_reply
from ferry.server.request_bodies import parse_body
from ferry.server.schemas import error_responses

ERRORS = error_responses(400, 401, 403, 404, 413, 415, 429, 500, 503)
STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE chunks"}
}


async def respond(
    stream: bool,
    full: Callable[[], Awaitable[object]],
    streamed: Callable[[], Awaitable[AsyncIterator[str]]],
) -> Reply | Stream:
    """The answer as JSON, or as SSE. Errors before the first byte (unknown model, prompt too
    long, overload) are raised here and answered with a status; later ones travel in the
    stream. A client that leaves cancels this (the gateway), which aborts the generation."""
    if stream:
        return Stream(await streamed())
    answer = await full()
    return json_reply(answer.model_dump() if isinstance(answer, BaseModel) else answer)


def resolve_and_bound(
    call: HotCall, model: str, field: str, texts: Sequence[str | list[int]], items: int
) -> ServedLLM:
    """The request's model, looked up once (UnknownModel) and kept as the metrics label (a
    configured name only); bounds checked before tokenizing, errors naming `field[i]`."""
    served: ServedLLM = call.services.openai.resolve(model)
    call.state["model_name"] = served.name
    settings = call.services.settings
    if items > settings.max_items_per_request:
        raise InvalidInput(field, f"{items} items; at most {settings.max_items_per_request}")
    for index, text in enumerate(texts):
        if isinstance(text, str):  # token ids: checked against the vocabulary and context later
            check_text(call, f"{field}[{index}]", text)
    return served


def check_text(call: HotCall, field: str, text: str) -> None:
    """One text within max_chars_per_text and valid Unicode, or a 400 naming `field`."""
    limit = call.services.settings.max_chars_per_text
    if len(text) > limit:
        raise InvalidInput(field, f"{len(text)} characters; at most {limit}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(field, "text is not valid Unicode (lone surrogate)") from None


async def chat_completions(call: HotCall) -> Reply | Stream:
    body = await parse_body(ChatCompletionRequest, call.body)
    serving = call.services.openai
    texts = [m.text for m in body.messages]
    served = resolve_and_bound(call, body.model, "messages", texts, len(body.messages))
    tenant = run_as(call, body.priority, body.cache_salt)
    return await respond(
        body.stream,
        lambda: serving.chat(body, served, tenant),
        lambda: serving.chat_stream(body, served, tenant),
    )


async def completions(call: HotCall) -> Reply | Stream:
    body = await parse_body(CompletionRequest, call.body)
    serving = call.services.openai
    prompts = body.prompts()
    served = resolve_and_bound(call, body.model, "prompt", prompts, len(prompts))
    tenant = run_as(call, body.priority, body.cache_salt)
    return await respond(
        body.stream,
        lambda: serving.completion(body, served, tenant),
        lambda: serving.completion_stream(body, served, tenant),
    )


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    for path, handler, summary, request, response in (
        (
            "/v1/chat/completions",
            chat_completions,
            "Chat Completions",
            ChatCompletionRequest,
            ChatCompletionResponse,
        ),
        ("/v1/completions", completions, "Completions", CompletionRequest, CompletionResponse),
    ):
        register(
            router,
            hot,
            path,
            handler,
            summary=summary,
            responses={**ERRORS, **STREAM_DOC},
            body_model=request,
            response_model=response,
        )
