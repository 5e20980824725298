"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API): thin hot routes
over `ferry.server.anthropic.messages` (the chat path)."""

from __future__ import annotations

from fastapi import APIRouter

from ferry.server.anthropic.messages import count_tokens, create_message, stream_message
from ferry.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from ferry.server.call_tenancy import run_as
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.replies import Reply, Stream, json_reply
from ferry.server.request_bodies import parse_body
from ferry.server.routes.openai_chat import (
    ERRORS,
    STREAM_DOC,
    check_text,
    resolve_and_bound,
    respond,
)
from ferry.server.tenancy import DEFAULT_PRIORITY


async def messages(call: HotCall) -> Reply | Stream:
    body = await parse_body(MessagesRequest, call.body)
    serving = call.services.openai
    texts = body.texts()
    served = resolve_and_bound(call, body.model, "messages", texts, len(texts))
    if isinstance(body.system, str):
        check_text(call, "system", body.system)
    tenant = run_as(call, DEFAULT_PRIORITY, None)  # Anthropic's API has no priority or salt
    return await respond(
        body.stream,
        lambda: create_message(serving, body, served, tenant),
        lambda: stream_message(serving, body, served, tenant),
    )


async def tokens(call: HotCall) -> Reply:
    body = await parse_body(CountTokensRequest, call.body)
    texts = body.texts()
    served = resolve_and_bound(call, body.model, "messages", texts, len(texts))
    return json_reply(await count_tokens(call.services.openai, body, served))


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    register(
        router,
        hot,
        "/v1/messages",
        messages,
        summary="Messages (Anthropic)",
        responses={**ERRORS, **STREAM_DOC},
        body_model=MessagesRequest,
    )
    register(
        router,
        hot,
        "/v1/messages/count_tokens",
        tokens,
        summary="Count message tokens (Anthropic)",
        responses=ERRORS,
        body_model=CountTokensRequest,
    )
