"""POST /v1/embeddings (OpenAI shape), served by the embedding models through the micro-batcher."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ferry.server.call_tenancy import call_priority
from ferry.server.encoder_request import EncoderInputs, Texts, TokenLists
from ferry.server.errors import InvalidInput
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.replies import Reply, json_reply
from ferry.server.request_bodies import parse_body
from ferry.server.schemas import PRIORITY_DESCRIPTION, Priority, error_responses

PATH = "/v1/embeddings"


class EmbeddingRequest(BaseModel):
    # An unknown field is a 400 naming it, as OpenAI answers (server/errors.py).
    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, gt=0)
    user: str | None = None
    # Extensions (vLLM's).
    priority: Priority = Field(default=0, description=PRIORITY_DESCRIPTION)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


def _inputs(body: EmbeddingRequest) -> EncoderInputs:
    """OpenAI's four shapes of `input`; its items are named `input` / `input[i]`."""
    items = body.input
    if isinstance(items, str):
        return Texts([items], "input")
    if not items or isinstance(items[0], str):
        return Texts(items, "input")  # type: ignore[arg-type]  # items[0] does not narrow the list
    if isinstance(items[0], int):
        return TokenLists([items], None, "input")
    return TokenLists(items, None, "input")


def _encode(vector: np.ndarray, encoding_format: str) -> np.ndarray | str:
    if encoding_format == "base64":
        # What the openai SDK decodes: little-endian float32 bytes, base64.
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector


async def create_embeddings(call: HotCall) -> Reply:
    body = await parse_body(EmbeddingRequest, call.body)
    registry = call.services.registry
    model = registry.get(body.model)
    call.state["model_name"] = model.name
    if "sentence_embedding" not in model.outputs.servable:
        raise InvalidInput("model", f"model {model.name!r} does not produce embeddings")
    if body.dimensions is not None and body.dimensions != model.outputs.width("sentence_embedding"):
        raise InvalidInput(
            "dimensions",
            f"model {model.name!r} has {model.outputs.width('sentence_embedding')} dimensions",
        )
    encoder = call.services.encoder
    valid = await encoder.validate(
        model, _inputs(body), ("sentence_embedding",), priority=call_priority(call, body.priority)
    )
    result = await encoder.run(model, valid, call.disconnected())
    tokens = result.prompt_tokens
    return json_reply(
        {
            "object": "list",
            "data": [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": _encode(row["sentence_embedding"], body.encoding_format),
                }
                for i, row in enumerate(result.rows)
            ],
            "model": model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    register(
        router,
        hot,
        PATH,
        create_embeddings,
        summary="Create Embeddings",
        responses=error_responses(400, 401, 403, 404, 413, 415, 429, 500, 503, 504),
        body_model=EmbeddingRequest,
        response_model=EmbeddingResponse,
    )
