"""Cross-encoder routes: POST /rerank (TEI's shape), POST /v1/rerank (Cohere's and Jina's, as
vLLM serves it) and POST /v1/score and /score (vLLM's). Each only parses its protocol and renders
its answer; scoring is `pair_scoring.py`'s, through the model's batcher."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ferry.server.encoder_model import EncoderModel
from ferry.server.encoder_request import Texts
from ferry.server.errors import InvalidInput
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.pair_scoring import (
    PairScores,
    check_cross_encoder,
    check_firsts,
    ranked,
    score_pairs,
)
from ferry.server.replies import Reply, json_reply
from ferry.server.request_bodies import parse_body
from ferry.server.route_table import HTTP_ROUTES
from ferry.server.schemas import PRIORITY_DESCRIPTION, Priority, error_responses

MODEL_DESCRIPTION = "A cross-encoder's name (exported with --task rerank); the default if absent."


class _Request(BaseModel):
    # Strict: a parameter Ferry does not know is one it cannot honour (a 4xx naming it).
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = Field(default=None, description=MODEL_DESCRIPTION)
    priority: Priority = Field(default=0, description=PRIORITY_DESCRIPTION)


class TeiRerankRequest(_Request):
    query: StrictStr
    texts: list[StrictStr]
    truncate: StrictBool | None = Field(
        default=False, description="Cut pairs longer than the model takes (at their end)."
    )
    # Only the end of a pair can be cut: "Left" is refused, not ignored.
    truncation_direction: Literal["Right", "right"] = "Right"
    raw_scores: StrictBool = Field(default=False, description="The logit, not its sigmoid.")
    return_text: StrictBool = False


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: StrictStr


class RerankRequest(_Request):
    query: StrictStr
    documents: list[StrictStr | Document]
    top_n: StrictInt | None = Field(
        default=None, ge=0, description="How many results to return, best first; all if 0."
    )
    return_documents: StrictBool = True


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: Document | None = None


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage


class ScoreRequest(_Request):
    text_1: StrictStr | list[StrictStr]
    text_2: StrictStr | list[StrictStr]


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: Usage


def _model(call: HotCall, name: str | None) -> EncoderModel:
    model: EncoderModel = call.services.registry.get(name)
    call.state["model_name"] = model.name
    check_cross_encoder(model)
    return model


async def _scores(
    call: HotCall,
    model: EncoderModel,
    firsts: list[str],
    seconds: Texts,
    priority: int,
    first_field: str = "query",
) -> PairScores:
    """Every pair scored through the model's batcher."""
    encoder, gone = call.services.encoder, call.disconnected()
    return await score_pairs(encoder, model, firsts, seconds, gone, priority, first_field)


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _max_chars(call: HotCall) -> int:
    limit: int = call.services.settings.max_chars_per_text
    return limit


async def tei_rerank(call: HotCall) -> Reply:
    body = await parse_body(TeiRerankRequest, call.body)
    model = _model(call, body.model)
    check_firsts("query", [body.query], _max_chars(call))
    texts = body.texts
    seconds = Texts(texts, "texts", bool(body.truncate))
    result = await _scores(call, model, [body.query] * len(texts), seconds, body.priority)
    scores = result.scores(raw=body.raw_scores)
    return json_reply(
        [
            {"index": i, "score": scores[i], **({"text": texts[i]} if body.return_text else {})}
            for i in ranked(scores)
        ]
    )


async def rerank(call: HotCall) -> Reply:
    body = await parse_body(RerankRequest, call.body)
    model = _model(call, body.model)
    check_firsts("query", [body.query], _max_chars(call))
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    seconds = Texts(texts, "documents")
    result = await _scores(call, model, [body.query] * len(texts), seconds, body.priority)
    scores = result.scores()
    return json_reply(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": model.name,
            "results": [
                {
                    "index": i,
                    "relevance_score": scores[i],
                    **({"document": {"text": texts[i]}} if body.return_documents else {}),
                }
                for i in ranked(scores, body.top_n)
            ],
            "usage": _usage(result.tokens),
        }
    )


def _score_pairs(body: ScoreRequest) -> tuple[list[str], list[str]]:
    """vLLM's pairing: one text_1 with each text_2, or text_1[i] with text_2[i]."""
    firsts = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    seconds = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    if len(firsts) == 1:
        return firsts * len(seconds), seconds
    if len(firsts) != len(seconds):
        raise InvalidInput(
            "text_2",
            f"text_2 has {len(seconds)} items; text_1 has {len(firsts)} (send 1 or as many)",
        )
    return firsts, seconds


async def score(call: HotCall) -> Reply:
    body = await parse_body(ScoreRequest, call.body)
    model = _model(call, body.model)
    if not body.text_1:
        raise InvalidInput("text_1", "the input list is empty")
    firsts, seconds = _score_pairs(body)
    check_firsts("text_1", firsts, _max_chars(call))
    seconds_texts = Texts(seconds, "text_2")
    result = await _scores(call, model, firsts, seconds_texts, body.priority, "text_1")
    return json_reply(
        {
            "id": f"score-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": model.name,
            "data": [
                {"index": i, "object": "score", "score": s} for i, s in enumerate(result.scores())
            ],
            "usage": _usage(result.tokens),
        }
    )


ERRORS = (401, 404, 413, 415, 429, 500, 503, 504)


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    register(
        router,
        hot,
        "/rerank",
        tei_rerank,
        summary="Rerank (TEI)",
        responses=error_responses(422, *ERRORS),
        body_model=TeiRerankRequest,
        response_model=list[TeiRank],
    )
    register(
        router,
        hot,
        "/v1/rerank",
        rerank,
        summary="Rerank (Cohere, Jina)",
        responses=error_responses(400, *ERRORS),
        body_model=RerankRequest,
        response_model=RerankResponse,
    )
    for path in ("/v1/score", "/score"):
        invalid = HTTP_ROUTES.dialect_of(path).invalid_status  # OpenAI's 400 or Ferry's 422
        register(
            router,
            hot,
            path,
            score,
            summary="Score (vLLM)",
            responses=error_responses(invalid, *ERRORS),
            body_model=ScoreRequest,
            response_model=ScoreResponse,
        )
