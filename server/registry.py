"""All models this process serves, looked up by name."""

from __future__ import annotations

import asyncio

from ferry.server.errors import UnknownModel
from ferry.server.metrics import FerryMetrics
from ferry.server.model_runtime import ModelRuntime
from ferry.server.settings import Settings


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: FerryMetrics) -> None:
        self.default_name = settings.default_model_name
        self.models = {m.name: ModelRuntime(m, metrics) for m in settings.models}

    def get(self, name: str | None) -> ModelRuntime:
        key = name or self.default_name
        try:
            return self.models[key]
        except KeyError:
            raise UnknownModel(key, list(self.models)) from None

    async def start(self) -> None:
        await asyncio.gather(*(model.start() for model in self.models.values()))

    async def ready(self) -> bool:
        states = await asyncio.gather(*(model.healthy() for model in self.models.values()))
        return all(states)

    async def close(self, drain_timeout_s: float) -> None:
        await asyncio.gather(
            *(model.close(drain_timeout_s) for model in self.models.values()),
            return_exceptions=True,
        )
