"""Stand-ins, in an API process, for the model runtimes and LLM engines the engine process owns.

They implement the interfaces the server calls (`EncoderModel`, `GraphModel`, `LLMEngine`),
rather than subclass the real ones: a model's metadata, tokenizer, output checks and rendering
stay here, `submit` forwards validated sequences and resolves with the engine's raw rows; a plain
graph's tensors are checked here against its signature (the engine's, learned at start), `infer`
forwards the rows; an LLM's chat tokenizer stays here, `generate` streams the engine's deltas.
Everything above (routes, encoder path, KServe, OpenAI serving) is unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Unpack, cast

import numpy as np

from ferry.backends.batch_plan import UNSTARTED, BatchPlan
from ferry.backends.tensor_signature import Signature
from ferry.batcher import TensorRows
from ferry.batcher.errors import QueueFull
from ferry.llm.base import EngineStats, GenerationDelta
from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.server.deadline_floor import refuse_unmeetable
from ferry.server.encoder import gather_results
from ferry.server.encoder_request import ValidSequences
from ferry.server.errors import InvalidInput
from ferry.server.graph_model import (
    GRAPH_TASK,
    InferOptions,
    check_chunks,
    graph_limits,
    graph_outputs,
    infer_options,
    plan_rows,
    refuse_sequence,
)
from ferry.server.image_inputs import ImageInputs, image_inputs
from ferry.server.metrics import FerryMetrics
from ferry.server.model_files import token_model_files
from ferry.server.model_outputs import ModelOutputs
from ferry.server.model_overrides import entry_from_json, entry_json
from ferry.server.model_repository import repository_entries
from ferry.server.openai.admission import Admitted
from ferry.server.procs import wire
from ferry.server.procs.client import EngineClient
from ferry.server.procs.wire import SYNC, GraphInfo, LLMInfo
from ferry.server.registry import ModelRegistry
from ferry.server.settings import LLMSettings, ModelSettings, Settings


@dataclass(frozen=True)
class BackendView:
    """What the API side reads of the engine process's backend (a `BackendInfo`)."""

    name: str
    output_names: tuple[str, ...]
    sequence_outputs: frozenset[str]
    max_concurrency: int
    takes_token_types: bool = False


class _EngineModel:
    """What every stand-in for one of the engine process's models does alike: readiness from
    the engine's reports, refusals counted here, deadlines kept here too."""

    def __init__(
        self, settings: ModelSettings, client: EngineClient, metrics: FerryMetrics
    ) -> None:
        self.settings = settings
        self.name = settings.name
        self._client = client
        self._metrics = metrics

    @property
    def ready(self) -> bool:
        return self._client.ready(self.name)

    async def healthy(self) -> bool:
        return self.ready

    def count_invalid(self) -> None:
        self._metrics.rejections.labels(self.name, "invalid").inc()

    def count_refused(self) -> None:
        """Refused here: the engine's window of unanswered bytes is full (client.py)."""
        self._metrics.rejections.labels(self.name, "queue_full").inc()

    def _deadline_s(self, timeout_s: float | None) -> float:
        # Admission is the engine's (its batcher's queue and limits); the deadline is kept on
        # both sides: here it holds even when the engine is stuck.
        return self.settings.timeout_s if timeout_s is None else timeout_s


class RemoteModelRuntime(_EngineModel):
    """An `EncoderModel` whose rows run in the engine process: tokenizing, validating and
    rendering happen here, with the output rules of the engine's model (learned at start)."""

    def __init__(
        self, settings: ModelSettings, client: EngineClient, metrics: FerryMetrics
    ) -> None:
        super().__init__(settings, client, metrics)
        self.manifest, self.tokenizer = token_model_files(settings)
        self.backend = BackendView(settings.backend.kind, (), frozenset(), 1)  # until `start`
        self.outputs = ModelOutputs(settings, self.manifest, self.backend, {})

    async def start(self) -> None:
        """Learns the engine's model."""
        model = next(m for m in self._client.started().models if m.name == self.name)
        self.backend = BackendView(
            model.backend,
            model.output_names,
            frozenset(model.sequence_outputs),
            model.max_concurrency,
            model.takes_token_types,
        )
        self.outputs = ModelOutputs(self.settings, self.manifest, self.backend, model.widths)

    def submit(self, valid: ValidSequences) -> list[asyncio.Future[dict[str, np.ndarray]]]:
        try:
            sequences = valid.sequences()
            return self._client.submit(
                self.name,
                wire.sequence_rows(sequences),
                valid.timeout_s,
                tuple(sorted(self.outputs.for_backend(valid.outputs))),
                valid.priority,
                self._deadline_s(valid.timeout_s),
                answers=len(sequences),
            )
        except QueueFull:
            self.count_refused()
            raise

    def check_deadline(self, longest: int, timeout_s: float) -> None:
        # The cost model lives in the engine process, which checks the same floor on Submit
        # (until its first report after the fit reaches here).
        refuse_unmeetable(self._client.fastest_row(self.name), longest, timeout_s)

    async def close(self, drain_timeout_s: float) -> None:
        self.tokenizer.close()


class RemoteGraph(_EngineModel):
    """A `GraphModel` whose rows run in the engine process: a request's tensors are checked
    here, by the rules of the engine's model (its signature, learned at start), and its
    outputs rendered here; only valid rows cross."""

    task = GRAPH_TASK

    def __init__(
        self, settings: ModelSettings, client: EngineClient, metrics: FerryMetrics
    ) -> None:
        super().__init__(settings, client, metrics)
        self._info = GraphInfo(
            self.name, settings.backend.kind, 1, Signature((), ()), UNSTARTED, (), {}
        )  # until `start`
        self.backend = BackendView(self._info.backend, (), frozenset(), 1)
        self.images: ImageInputs | None = None  # decoded here, as the engine's model would
        self._limits = graph_limits(settings, 1, False)  # the engine's batcher's, from `start`

    @property
    def signature(self) -> Signature:
        return self._info.signature

    @property
    def graph_signature(self) -> Signature:
        return self._info.signature  # no stateful graph here (settings refuse it)

    @property
    def class_keys(self) -> Mapping[str, list[Any]]:
        return self._client.classes.get(self.name, self._info.class_keys)

    async def sync_classes(self) -> None:
        """Another API process's request may have taught them: the engine told every API
        process before that answer, so one round trip has them here."""
        keys = self.class_keys
        if any(s.class_map and s.name not in keys for s in self.signature.outputs):
            await self._client.call(self.name, SYNC)

    @property
    def batchable(self) -> bool:
        return self._info.batch_plan.batched

    @property
    def batch_plan(self) -> BatchPlan:
        return self._info.batch_plan

    async def start(self) -> None:
        """Learns the engine's model."""
        info = next(g for g in self._client.started().graphs if g.name == self.name)
        self._info = info
        self.backend = BackendView(info.backend, (), frozenset(), info.max_concurrency)
        self._limits = graph_limits(self.settings, info.max_concurrency, self.batchable)
        self.images = image_inputs(
            self.settings, info.metadata, replace(info.signature, images=frozenset())
        )

    def validate(self, tensors: Mapping[str, np.ndarray]) -> TensorRows:
        info = self._info
        try:
            plan = info.batch_plan
            rows = plan_rows(info.signature, plan, tensors)
            check_chunks(rows, self._limits, plan.batched, info.signature)
        except InvalidInput:
            self.count_invalid()
            raise
        return rows

    def select_outputs(
        self, requested: Sequence[str | None] | None, *, tensors: bool = False
    ) -> tuple[str, ...]:
        return graph_outputs(self.signature, self._info.default_outputs, requested, tensors)

    async def infer(
        self, rows: TensorRows, outputs: Sequence[str], **options: Unpack[InferOptions]
    ) -> dict[str, np.ndarray]:
        timeout_s, priority, disconnected = infer_options(options)
        refuse_sequence(self.name, options)  # stateful graphs are served in one process
        try:
            (future,) = self._client.submit(
                self.name, rows, timeout_s, tuple(outputs), priority, self._deadline_s(timeout_s)
            )
        except QueueFull:
            self.count_refused()
            raise
        (result,) = await gather_results([future], disconnected)
        return result

    async def close(self, drain_timeout_s: float) -> None:
        if self.images is not None:
            self.images.close()


class RemoteRegistry(ModelRegistry):
    """The engine process's models, as stand-ins: built from what it serves (wire.Info), and
    rebuilt when that changes (a load or unload, which it also runs)."""

    def __init__(self, settings: Settings, client: EngineClient, metrics: FerryMetrics) -> None:
        super().__init__({}, {}, settings.default_model_name, {})
        self._settings = settings
        self._client = client
        self._metrics = metrics
        self._entries: dict[str, str] = {}  # each stand-in's settings, as the engine sent them
        self._place(self._changed(client.started()))
        client.on_models = self._apply

    def _changed(self, info: wire.Info) -> dict[str, RemoteModel]:
        """Stand-ins for the models `info` serves that are new or have other settings."""
        configured = repository_entries(self._settings)
        built: dict[str, RemoteModel] = {}
        for name in (*(m.name for m in info.models), *(g.name for g in info.graphs)):
            text = info.settings.get(name)
            if text is None or self._entries.get(name) != text:
                entry = entry_from_json(text) if text else configured[name]
                assert isinstance(entry, ModelSettings)
                graph = any(g.name == name for g in info.graphs)
                kind = RemoteGraph if graph else RemoteModelRuntime
                built[name] = kind(entry, self._client, self._metrics)
        for llm in info.llms:
            text = info.settings.get(llm.name)
            if text is None or self._entries.get(llm.name) != text:
                entry = entry_from_json(text) if text else configured[llm.name]
                assert isinstance(entry, LLMSettings)
                built[llm.name] = RemoteLLMEngine(entry, self._client)
        self._entries = dict(info.settings)
        return built

    def _place(self, built: Mapping[str, RemoteModel]) -> None:
        for name, model in built.items():
            self.take(name)
            if isinstance(model, RemoteGraph):
                self.graphs[name] = model
            elif isinstance(model, RemoteModelRuntime):
                self.encoders[name] = model
            else:
                self.llms[name] = model

    async def _apply(self, info: wire.Info) -> None:
        """The engine's models now: new ones started (they read `info`), gone ones closed."""
        served = {*(m.name for m in info.models), *(g.name for g in info.graphs)}
        served |= {llm.name for llm in info.llms}
        gone = [self.take(name) for name in self.names() if name not in served]
        built = await asyncio.to_thread(self._changed, info)  # tokenizers read off the loop
        await asyncio.gather(*(model.start() for model in built.values()))
        self._place(built)
        for model in gone:
            if isinstance(model, RemoteLLMEngine):
                await model.close()
            elif isinstance(model, (RemoteModelRuntime, RemoteGraph)):
                await model.close(0)

    async def load(self, entry: ModelSettings | LLMSettings) -> None:
        """Loaded by the engine process, which answers once every API process serves it."""
        await self._client.call(entry.name, "load_model", entry_json(entry))

    async def unload(self, name: str) -> bool:
        served = name in self.names()
        await self._client.call(name, "unload_model")
        return served

    async def close(self, drain_timeout_s: float) -> None:
        await super().close(drain_timeout_s)
        await self._client.close()


class RemoteLLMEngine:
    """An `LLMEngine` whose generations run in the engine process."""

    def __init__(self, settings: LLMSettings, client: EngineClient) -> None:
        self.name = settings.name
        self.tokenizer = ChatTokenizer(
            settings.path, escape_special_tokens=not settings.special_tokens_in_content
        )
        self._client = client
        self.max_context_tokens = 0
        self.sampling_options: frozenset[str] = frozenset()
        self._max_concurrent = 1

    @property
    def max_concurrent_generations(self) -> int:
        return self._max_concurrent

    def learn(self, info: LLMInfo) -> None:
        self.max_context_tokens = info.max_context_tokens
        self.sampling_options = frozenset(info.sampling_options)
        self._max_concurrent = info.max_concurrent_generations

    async def admit(self, count: int) -> Admitted:
        """A request's generations, admitted by the engine process (all or none): every API
        process shares its capacity, so none of them can count it alone."""
        ticket = await self._client.admit(self.name, count)
        return Admitted(
            partial(self._client.generate, self.name, ticket),
            partial(self._client.release, ticket),
        )

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[GenerationDelta]:
        """`LLMEngine.generate`, run by the engine process (admitted alone); closing the
        iterator aborts it. The serving layer admits a request's generations together."""
        admitted = await self.admit(1)
        try:
            generation = cast(AsyncGenerator[GenerationDelta], admitted.generate(*args, **kwargs))
            async with aclosing(generation) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            admitted.release()

    def adapter_names(self) -> list[str]:
        return list(self._client.adapters.get(self.name, ()))

    async def load_adapter(self, name: str, path: Path) -> None:
        # Answered once every API process has the new list (wire.Adapters).
        await self._client.call(self.name, "load_adapter", name, str(path))

    async def unload_adapter(self, name: str) -> None:
        await self._client.call(self.name, "unload_adapter", name)

    async def start(self) -> None:
        self.learn(next(llm for llm in self._client.started().llms if llm.name == self.name))

    async def close(self) -> None:
        pass

    def is_ready(self) -> bool:
        return self._client.ready(self.name, llm=True)

    def stats(self) -> EngineStats:
        # The engine's latest report: a scrape reaches one API process, which reads it here
        # (the engine writes no file for these series, so nothing is counted twice).
        return self._client.llm_stats(self.name) or EngineStats(0, 0)


RemoteModel = RemoteModelRuntime | RemoteGraph | RemoteLLMEngine


async def connect(
    settings: Settings, client: EngineClient, metrics: FerryMetrics
) -> RemoteRegistry:
    await client.start()
    return RemoteRegistry(settings, client, metrics)
