"""POST /v1/embeddings (OpenAI shape), served by the embedding models through the micro-batcher."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import APIRouter, Request, Response
from ferry.batcher import TokenSequence
from ferry.batcher.errors import InvalidInput
from ferry.server.disconnect import ClientDisconnected, gather_unless_disconnected
from ferry.server.request_limits import check_request_size
from ferry.server.schemas import error_responses
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

router = APIRouter()


class EmbeddingRequest(BaseModel):
    # Unknown fields are accepted, as OpenAI clients send extras freely.
    model_config = ConfigDict(extra="allow")

    model: StrictStr
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, gt=0)
    user: str | None = None


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


def _sequences(body: EmbeddingRequest, tokenizer) -> list[TokenSequence]:
    items = body.input
    if items == [] or items == "":
        raise InvalidInput("input", "input must not be empty")
    if isinstance(items, str):
        return tokenizer.encode([items])
    if isinstance(items[0], str):
        return tokenizer.encode(list(items))  # type: ignore[arg-type]
    if isinstance(items[0], int):
        return [TokenSequence.from_ids(items)]  # type: ignore[arg-type]
    return [TokenSequence.from_ids(ids) for ids in items]  # type: ignore[union-attr]


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        # What the openai SDK decodes: little-endian float32 bytes, base64.
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingResponse,
    responses=error_responses(400, 401, 404, 413, 429, 500, 503, 504),
)
async def create_embeddings(
    body: EmbeddingRequest, request: Request
) -> EmbeddingResponse | Response:
    model = request.app.state.registry.get(body.model)
    request.state.model_name = model.name
    if "sentence_embedding" not in model.servable_outputs:
        raise InvalidInput("model", f"model {model.name!r} does not produce embeddings")
    try:
        sequences = _sequences(body, model.tokenizer)
        check_request_size(sequences, request.app.state.settings, "input")
        futures = model.submit(sequences, None)
    except InvalidInput as exc:
        # Name the field as this endpoint's clients know it.
        field = exc.field.replace("input_ids", "input").replace("inputs", "input")
        raise InvalidInput(field, exc.message) from None
    try:
        rows = await gather_unless_disconnected(request, futures)
    except ClientDisconnected:
        return Response(status_code=499)
    vectors = [row["sentence_embedding"] for row in rows]
    if body.dimensions is not None and body.dimensions != vectors[0].shape[0]:
        raise InvalidInput(
            "dimensions", f"model {model.name!r} has {vectors[0].shape[0]} dimensions"
        )
    tokens = sum(seq.length for seq in sequences)
    return EmbeddingResponse(
        data=[
            EmbeddingData(index=i, embedding=_encode(v, body.encoding_format))
            for i, v in enumerate(vectors)
        ],
        model=model.name,
        usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
    )
