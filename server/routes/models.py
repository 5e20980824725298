"""GET /v1/models (every model Ferry serves, in OpenAI's list shape) and /v1/models/{id}."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel

from ferry.server.errors import UnknownModel
from ferry.server.schemas import error_responses
from ferry.server.services import services_of

router = APIRouter()


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ferry"
    task: str
    parent: str | None = None  # a LoRA adapter's base model, as vLLM lists it


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def model_cards(request: Request) -> list[ModelCard]:
    services = services_of(request)
    return [
        ModelCard(id=e.name, created=services.started_at, task=e.task, parent=e.parent)
        for e in services.registry.entries()
    ]


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    return ModelList(data=model_cards(request))


# `{model_id:path}`: OpenAI-style ids may hold slashes (org/model), as LLM names here may.
@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=error_responses(404))
async def retrieve_model(model_id: str, request: Request) -> ModelCard:
    cards = model_cards(request)
    for card in cards:
        if card.id == model_id:
            return card
    raise UnknownModel(model_id, [c.id for c in cards])
