"""GET /v1/models: every model Ferry serves, in OpenAI's list shape."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel

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


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    state = request.app.state
    cards = [
        ModelCard(id=name, created=state.started_at, task=model.manifest.task)
        for name, model in state.registry.models.items()
    ]
    cards += [
        ModelCard(id=m.name, created=state.started_at, task="chat", parent=m.parent)
        for m in state.openai.served_models()
    ]
    return ModelList(data=cards)
