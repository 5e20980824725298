"""POST /tokenize and POST /detokenize in vLLM's shapes, for every model with a tokenizer
(encoders and chat models alike)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from ferry.server.errors import InvalidInput
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.model_tokenizers import model_tokenizer
from ferry.server.openai.protocol import ChatMessageParam, template_messages
from ferry.server.replies import Reply, json_reply
from ferry.server.request_bodies import parse_body
from ferry.server.schemas import error_responses

ERRORS = error_responses(401, 404, 413, 415, 422, 503)


class TokenizeRequest(BaseModel):
    # Strict: a parameter Ferry does not know is one it cannot honour (a 422 naming it).
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = Field(default=None, description="The default encoder if absent.")
    prompt: StrictStr | None = None
    messages: list[ChatMessageParam] | None = Field(
        default=None, description="Chat messages, rendered with the model's chat template."
    )
    # vLLM's defaults: a prompt gets the tokenizer's special tokens, a chat its template's.
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False

    @model_validator(mode="after")
    def _one_kind_of_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of 'prompt' or 'messages'")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    tokens: list[StrictInt]


class DetokenizeResponse(BaseModel):
    prompt: str


async def tokenize(call: HotCall) -> Reply:
    body = await parse_body(TokenizeRequest, call.body)
    tokenizer = model_tokenizer(call.services.registry, body.model)
    call.state["model_name"] = tokenizer.name
    limit = call.services.settings.max_chars_per_text
    if body.messages is not None:
        if body.add_special_tokens:
            raise InvalidInput(
                "add_special_tokens", "a chat template places its own special tokens"
            )
        messages = template_messages(body.messages)
        if sum(len(m["content"]) for m in messages) > limit:
            raise InvalidInput("messages", f"more than {limit} characters")
        ids = tokenizer.encode_chat(messages, body.add_generation_prompt)
    else:
        assert body.prompt is not None
        if len(body.prompt) > limit:
            raise InvalidInput("prompt", f"{len(body.prompt)} characters; at most {limit}")
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = tokenizer.encode(body.prompt, add_special)
    answer: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": tokenizer.max_model_len,
        "tokens": ids,
    }
    if body.return_token_strs:
        answer["token_strs"] = tokenizer.token_strs(ids)
    return json_reply(answer)


async def detokenize(call: HotCall) -> Reply:
    body = await parse_body(DetokenizeRequest, call.body)
    tokenizer = model_tokenizer(call.services.registry, body.model)
    call.state["model_name"] = tokenizer.name
    tokenizer.check_ids("tokens", body.tokens)
    return json_reply({"prompt": tokenizer.decode(body.tokens)})


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    register(
        router,
        hot,
        "/tokenize",
        tokenize,
        summary="Tokenize",
        responses=ERRORS,
        body_model=TokenizeRequest,
        response_model=TokenizeResponse,
    )
    register(
        router,
        hot,
        "/detokenize",
        detokenize,
        summary="Detokenize",
        responses=ERRORS,
        body_model=DetokenizeRequest,
        response_model=DetokenizeResponse,
    )
