"""Every model this process serves, looked up by name: encoders, LLM engines and the LoRA
adapters loaded on them. One place answers "what is `name`?", with one unknown-model error.

Models come and go at runtime (Triton's model repository extension, server/model_repository.py):
`load` builds and starts one off the event loop, then puts it in place (of the old one, on a
reload); `unload` takes it out first, so new requests for it are 404s, then drains it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ferry.llm.base import EngineStats, LLMEngine
from ferry.llm.errors import InvalidAdapter
from ferry.llm.ortgenai_prefix import PrefixCache
from ferry.server.encoder_model import EncoderModel
from ferry.server.errors import UnknownModel
from ferry.server.graph_model import GraphModel
from ferry.server.graph_runtime import GraphRuntime
from ferry.server.llm_engines import build_llm_engine
from ferry.server.metrics import FerryMetrics
from ferry.server.model_files import plain_graph
from ferry.server.model_runtime import ModelRuntime
from ferry.server.progress import Progress
from ferry.server.settings import LLMSettings, ModelSettings, Settings

# How often an unloading LLM's engine is asked whether its generations finished.
IDLE_CHECK_S = 0.02


@dataclass(frozen=True)
class ServedLLM:
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
        graphs: Mapping[str, GraphModel] | None = None,
    ) -> None:
        self.default_name = default_name  # the encoder a request naming none gets
        self.encoders = dict(encoders or {})  # token models (KServe, /predict, embeddings)
        self.graphs = dict(graphs or {})  # plain graphs (KServe, /predict)
        self.llms = dict(llms or {})  # base LLMs by configured name
        self._unloads: set[asyncio.Task[None]] = set()
        self._builder: LocalModels | None = None  # set when this process runs its models
        self.drain_timeout_s = 20.0

    @classmethod
    def local(cls, settings: Settings, metrics: FerryMetrics) -> ModelRegistry:
        """The models served at start (settings.served_at_start), run in this process (not yet
        started), and the means to load others."""
        builder = LocalModels(settings, metrics)
        served = settings.served_at_start()
        encoders, tensors = local_models(served, metrics)
        llms = {m.name: build_llm_engine(m, builder.prefix_store) for m in served.llm_models}
        registry = cls(encoders, llms, settings.default_model_name, tensors)
        registry._builder = builder
        registry.drain_timeout_s = settings.drain_timeout_s
        return registry

    # -- lookups ----------------------------------------------------------------------------------

    def get(self, name: str | None) -> EncoderModel:
        """The encoder `name` (the default one for None)."""
        key = name or self.default_name
        model = self.encoders.get(key) if key is not None else None
        if model is None:
            raise UnknownModel(key or "", self.names())
        return model

    def graph(self, name: str | None) -> GraphModel | None:
        """The plain graph `name` (the default model for None); None where `name` is an
        encoder, UnknownModel where it is neither."""
        key = name or self.default_name
        graph = self.graphs.get(key) if key is not None else None
        if graph is None:
            self.get(name)  # an encoder, or refused
        return graph

    def llm(self, name: str) -> ServedLLM:
        """The LLM `name`: a base model, or an adapter loaded on one."""
        engine = self.llms.get(name)
        if engine is not None:
            return ServedLLM(name, engine, name)
        for base, engine in self.llms.items():
            if name in engine.adapter_names():
                return ServedLLM(name, engine, base, name)
        raise UnknownModel(name, self.names())

    def served_llms(self) -> list[ServedLLM]:
        """Every base LLM and every loaded adapter, by name."""
        served = [ServedLLM(name, engine, name) for name, engine in self.llms.items()]
        for base, engine in self.llms.items():
            served += [ServedLLM(a, engine, base, a) for a in engine.adapter_names()]
        return sorted(served, key=lambda m: m.name)

    def entries(self) -> list[ModelEntry]:
        """Every served name: LLMs first, then their adapters, then encoders. OpenAI clients that
        pick a default model take the first listed (guidellm does): it should generate."""
        llms = sorted(self.served_llms(), key=lambda m: m.parent is not None)  # stable: by name
        entries = [ModelEntry(m.name, "chat", m.parent) for m in llms]
        entries += [ModelEntry(name, m.manifest.task) for name, m in self.encoders.items()]
        return entries + [ModelEntry(name, m.task) for name, m in self.graphs.items()]

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

    # -- models loaded and unloaded at runtime ----------------------------------------------------

    async def load(self, entry: ModelSettings | LLMSettings) -> None:
        """Serve `entry`: built and started off the event loop (every other model keeps
        serving), then put in place; on a reload the old one drains after the swap."""
        assert self._builder is not None, "a registry of models run elsewhere loads there"
        model = await self._builder.build(entry)
        old = self.take(entry.name)
        if isinstance(model, ModelRuntime):
            self.encoders[entry.name] = model
        elif isinstance(model, GraphRuntime):
            self.graphs[entry.name] = model
        else:
            self.llms[entry.name] = model
        if old is not None:
            await self.retire(old)
            if isinstance(model, (ModelRuntime, GraphRuntime)):
                await model.healthy()  # the gauge the old one's close set to 0, set again

    async def unload(self, name: str) -> bool:
        """Stop serving `name` (False: it was not served): new requests for it are 404s at
        once; those in flight finish (up to drain_timeout_s), then it is closed."""
        old = self.take(name)
        if old is None:
            return False
        await self.retire(old)
        return True

    def take(self, name: str) -> EncoderModel | GraphModel | LLMEngine | None:
        """`name` out of the registry (new requests for it are 404s), not yet closed."""
        for served in (self.encoders, self.graphs, self.llms):
            model = served.pop(name, None)
            if model is not None:
                return model
        return None

    async def retire(self, model: EncoderModel | GraphModel | LLMEngine) -> None:
        """A model taken out: its requests in flight finish (up to drain_timeout_s), then it
        closes."""
        if isinstance(model, (ModelRuntime, GraphRuntime)):  # what this process runs
            await model.close(self.drain_timeout_s)  # its batcher drains first
            return
        llm: LLMEngine = model  # type: ignore[assignment]  # the other kind
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_idle(llm), self.drain_timeout_s)
        await llm.close()

    # -- lifecycle --------------------------------------------------------------------------------

    def loads(self) -> int:
        """How many models start() loads (adapters come with their engine)."""
        return len(self.encoders) + len(self.graphs) + len(self.llms)

    async def start(self, progress: Progress | None = None) -> None:
        """Load every model at once; `progress` is told as each one is ready (where they load:
        not in an API process, whose stand-ins only connect)."""
        starts = {
            **{name: model.start() for name, model in self.encoders.items()},
            **{name: model.start() for name, model in self.graphs.items()},
            **{name: engine.start() for name, engine in self.llms.items()},
        }
        await asyncio.gather(*(_told(name, start, progress) for name, start in starts.items()))

    async def ready(self) -> bool:
        """Every encoder loaded and its backend healthy (KServe's server readiness)."""
        models: list[EncoderModel | GraphModel] = [*self.encoders.values(), *self.graphs.values()]
        states = await asyncio.gather(*(model.healthy() for model in models))
        return all(states)

    def readiness(self) -> dict[str, bool]:
        """Each served name for /health/ready: encoders loaded, LLMs (and their adapters) on a
        running engine."""
        encoders = {name: model.ready for name, model in self.encoders.items()}
        encoders |= {name: model.ready for name, model in self.graphs.items()}
        return encoders | {m.name: m.engine.is_ready() for m in self.served_llms()}

    async def close(self, drain_timeout_s: float) -> None:
        """Encoders drain first (up to the timeout), then the engines stop."""
        await asyncio.gather(
            *(model.close(drain_timeout_s) for model in self.encoders.values()),
            *(model.close(drain_timeout_s) for model in self.graphs.values()),
            return_exceptions=True,
        )
        await asyncio.gather(*(e.close() for e in self.llms.values()), return_exceptions=True)


async def _told(name: str, start: Awaitable[None], progress: Progress | None) -> None:
    started = time.monotonic()
    await start
    if progress is not None:
        progress.advance(1, f"{name} ready", time.monotonic() - started)


async def _idle(engine: LLMEngine) -> None:
    """Returns once the engine runs and queues no generation."""
    while True:
        stats = engine.stats()
        if not stats.running and not stats.waiting:
            return
        await asyncio.sleep(IDLE_CHECK_S)


def local_models(
    settings: Settings, metrics: FerryMetrics
) -> tuple[dict[str, ModelRuntime], dict[str, GraphRuntime]]:
    """The configured encoders and plain graphs, run in this process (not yet started)."""
    encoders, tensors = {}, {}
    for model in settings.models:
        built = local_model(model, metrics)
        if isinstance(built, GraphRuntime):
            tensors[model.name] = built
        else:
            encoders[model.name] = built
    return encoders, tensors


def local_model(settings: ModelSettings, metrics: FerryMetrics) -> ModelRuntime | GraphRuntime:
    """One configured encoder or plain graph, run in this process (not yet started)."""
    graph = plain_graph(settings)
    if graph is None:
        return ModelRuntime(settings, metrics)
    return GraphRuntime(settings, graph, metrics)


class LocalModels:
    """Builds a repository entry's model, to run in this process, started: its files are read
    and its sessions made in threads, so the event loop (every other model) never waits."""

    def __init__(self, settings: Settings, metrics: FerryMetrics) -> None:
        self._metrics = metrics
        # The ortgenai engines share one prefix cache, loaded ones too (prefix_cache_bytes).
        self.prefix_store = PrefixCache(settings.prefix_cache_bytes)

    async def build(
        self, entry: ModelSettings | LLMSettings
    ) -> ModelRuntime | GraphRuntime | LLMEngine:
        if isinstance(entry, LLMSettings):
            engine = await asyncio.to_thread(build_llm_engine, entry, self.prefix_store)
            try:
                await engine.start()
            except BaseException:
                await engine.close()
                raise
            return engine
        model = await asyncio.to_thread(local_model, entry, self._metrics)
        try:
            await model.start()
        except BaseException:
            await model.close(0)
            raise
        return model
