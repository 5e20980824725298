"""Every model this process serves, looked up by name: encoders, LLM engines and the LoRA
adapters loaded on them. One place answers "what is `name`?", with one unknown-model error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ferry.llm.base import EngineStats, LLMEngine
from ferry.llm.errors import InvalidAdapter
from ferry.server.encoder_model import EncoderModel
from ferry.server.errors import UnknownModel
from ferry.server.graph_model import GraphModel
from ferry.server.metrics import FerryMetrics
from ferry.server.model_files import plain_graph
from ferry.server.model_runtime import ModelRuntime
from ferry.server.progress import Progress
from ferry.server.settings import Settings
from ferry.server.tensor_model import TensorModel


@dataclass(frozen=True)
class ServedModel:
    """An LLM name requests can ask for: a base model, or a LoRA adapter on one."""

    name: str
    engine: LLMEngine
    base: str  # the engine's configured name
    adapter: str | None = None

    @property
    def parent(self) -> str | None:
        return self.base if self.adapter is not None else None


@dataclass(frozen=True)
class ModelEntry:
    """One served name as /v1/models lists it."""

    name: str
    task: str  # the encoder's manifest task, "tensor" (a plain graph), or "chat"
    parent: str | None = None  # a LoRA adapter's base model, as vLLM lists it


class ModelRegistry:
    def __init__(
        self,
        encoders: Mapping[str, EncoderModel] | None = None,
        llms: Mapping[str, LLMEngine] | None = None,
        default_name: str | None = None,
        tensors: Mapping[str, GraphModel] | None = None,
    ) -> None:
        self.default_name = default_name  # the encoder a request naming none gets
        self.models = dict(encoders or {})  # encoders (KServe, /predict, embeddings)
        self.tensors = dict(tensors or {})  # plain graphs (KServe, /predict)
        self.llms = dict(llms or {})  # base LLMs by configured name
        self._unloads: set[asyncio.Task[None]] = set()

    @classmethod
    def from_settings(
        cls, settings: Settings, metrics: FerryMetrics, llms: Mapping[str, LLMEngine]
    ) -> ModelRegistry:
        encoders, tensors = local_models(settings, metrics)
        return cls(encoders, llms, settings.default_model_name, tensors)

    # -- lookups ----------------------------------------------------------------------------------

    def get(self, name: str | None) -> EncoderModel:
        """The encoder `name` (the default one for None)."""
        key = name or self.default_name
        model = self.models.get(key) if key is not None else None
        if model is None:
            raise UnknownModel(key or "", self.names())
        return model

    def find(self, name: str | None) -> EncoderModel | GraphModel:
        """The encoder or plain graph `name` (the default one for None)."""
        key = name or self.default_name
        tensor = self.tensors.get(key) if key is not None else None
        return tensor if tensor is not None else self.get(name)

    def llm(self, name: str) -> ServedModel:
        """The LLM `name`: a base model, or an adapter loaded on one."""
        engine = self.llms.get(name)
        if engine is not None:
            return ServedModel(name, engine, name)
        for base, engine in self.llms.items():
            if name in engine.adapter_names():
                return ServedModel(name, engine, base, name)
        raise UnknownModel(name, self.names())

    def served_llms(self) -> list[ServedModel]:
        """Every base LLM and every loaded adapter, by name."""
        served = [ServedModel(name, engine, name) for name, engine in self.llms.items()]
        for base, engine in self.llms.items():
            served += [ServedModel(a, engine, base, a) for a in engine.adapter_names()]
        return sorted(served, key=lambda m: m.name)

    def entries(self) -> list[ModelEntry]:
        """Every served name: LLMs first, then their adapters, then encoders. OpenAI clients that
        pick a default model take the first listed (guidellm does): it should generate."""
        llms = sorted(self.served_llms(), key=lambda m: m.parent is not None)  # stable: by name
        entries = [ModelEntry(m.name, "chat", m.parent) for m in llms]
        entries += [ModelEntry(name, m.manifest.task) for name, m in self.models.items()]
        return entries + [ModelEntry(name, m.task) for name, m in self.tensors.items()]

    def names(self) -> list[str]:
        return [entry.name for entry in self.entries()]

    def engine_stats(self) -> dict[str, EngineStats]:
        """Per-engine running/waiting counts (adapters included), for the metrics."""
        return {name: engine.stats() for name, engine in self.llms.items()}

    # -- adapters ---------------------------------------------------------------------------------

    async def load_adapter(self, name: str, path: Path, base: str) -> None:
        if name in self.names():
            raise InvalidAdapter("lora_name", f"The model `{name}` is already served.")
        engine = self.llms.get(base)
        if engine is None:
            raise UnknownModel(base, self.names())
        await engine.load_adapter(name, path)

    async def unload_adapter(self, name: str) -> None:
        """Returns once the requests on `name` finished and it is freed; new ones fail now.
        The unload itself runs on even if the caller goes away, so nothing is left half-done."""
        served = self.llm(name)
        if served.adapter is None:
            raise InvalidAdapter("lora_name", f"`{name}` is a base model, not a LoRA adapter.")
        task = asyncio.create_task(served.engine.unload_adapter(name))
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)
        await asyncio.shield(task)

    # -- lifecycle --------------------------------------------------------------------------------

    def loads(self) -> int:
        """How many models start() loads (adapters come with their engine)."""
        return len(self.models) + len(self.tensors) + len(self.llms)

    async def start(self, progress: Progress | None = None) -> None:
        """Load every model at once; `progress` is told as each one is ready (where they load:
        not in an API process, whose stand-ins only connect)."""
        starts = {
            **{name: model.start() for name, model in self.models.items()},
            **{name: model.start() for name, model in self.tensors.items()},
            **{name: engine.start() for name, engine in self.llms.items()},
        }
        await asyncio.gather(*(_told(name, start, progress) for name, start in starts.items()))

    async def ready(self) -> bool:
        """Every encoder loaded and its backend healthy (KServe's server readiness)."""
        models: list[EncoderModel | GraphModel] = [*self.models.values(), *self.tensors.values()]
        states = await asyncio.gather(*(model.healthy() for model in models))
        return all(states)

    def readiness(self) -> dict[str, bool]:
        """Each served name for /health/ready: encoders loaded, LLMs (and their adapters) on a
        running engine."""
        encoders = {name: model.ready for name, model in self.models.items()}
        encoders |= {name: model.ready for name, model in self.tensors.items()}
        return encoders | {m.name: m.engine.is_ready() for m in self.served_llms()}

    async def close(self, drain_timeout_s: float) -> None:
        """Encoders drain first (up to the timeout), then the engines stop."""
        await asyncio.gather(
            *(model.close(drain_timeout_s) for model in self.models.values()),
            *(model.close(drain_timeout_s) for model in self.tensors.values()),
            return_exceptions=True,
        )
        await asyncio.gather(*(e.close() for e in self.llms.values()), return_exceptions=True)


async def _told(name: str, start: Awaitable[None], progress: Progress | None) -> None:
    started = time.monotonic()
    await start
    if progress is not None:
        progress.advance(1, f"{name} ready", time.monotonic() - started)


def local_models(
    settings: Settings, metrics: FerryMetrics
) -> tuple[dict[str, ModelRuntime], dict[str, TensorModel]]:
    """The configured encoders and plain graphs, run in this process (not yet started)."""
    encoders, tensors = {}, {}
    for model in settings.models:
        graph = plain_graph(model)
        if graph is None:
            encoders[model.name] = ModelRuntime(model, metrics)
        else:
            tensors[model.name] = TensorModel(model, graph, metrics)
    return encoders, tensors
