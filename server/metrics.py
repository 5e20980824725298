"""Every Prometheus metric Ferry exports, in one place (dashboards and alerts use exactly these).

Names carry their unit; label sets stay small (model, endpoint, status class, reason) so the
series count is bounded by configuration, not by traffic.
"""

from __future__ import annotations

import functools
import operator
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from ferry.batcher.observer import FormedBatch, RejectReason
from ferry.llm.base import EngineStats
from ferry.server.connection_limits import REFUSAL_REASONS, RefusalReason
from ferry.server.gpu_metrics import GpuCollector, load_nvml
from ferry.server.procs.metrics_merge import MULTIPROC_ENV
from ferry.server.turn_writes import TurnWrites, observe_all

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Priorities with their own queue-wait series; every other priority is counted as "other".
DEFAULT_PRIORITY_LEVELS = (-10, 0, 10)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Stops of a process's event loop (collections, its lag): 0.5 ms to 0.5 s.
PAUSE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


PER_MODEL = ("model",)  # the label set of most series
_Family = TypeVar("_Family", bound="EngineStatsFamily")
# How a gauge's values from several processes are joined (prometheus_client's modes).
MultiprocessMode = Literal["all", "min", "mostrecent"]


class _Declare:
    """FerryMetrics' series, declared on its registry. Most are per model and most histograms
    time something, so those are the defaults: each declaration states only what is its own."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self.engine_families: list[EngineStatsFamily] = []

    def counter(self, name: str, documentation: str, labels: Sequence[str] = PER_MODEL) -> Counter:
        return Counter(name, documentation, labels, registry=self._registry)

    def gauge(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = PER_MODEL,
        across_processes: MultiprocessMode = "all",
    ) -> Gauge:
        """`across_processes`: how /metrics joins the processes' values (`api_servers`,
        `replicas`): "all" is summed (metrics_merge.py); "min" or "mostrecent" for a state that
        every replica holds its own copy of."""
        return Gauge(
            name, documentation, labels, registry=self._registry, multiprocess_mode=across_processes
        )

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = PER_MODEL,
        buckets: Sequence[float] = LATENCY_BUCKETS_S,
    ) -> Histogram:
        return Histogram(name, documentation, labels, buckets=buckets, registry=self._registry)

    def engine_gauge(self, name: str, documentation: str, field: str) -> EngineStatsFamily:
        return self._engine_series(GaugeMetricFamily, name, documentation, field)

    def engine_counter(self, name: str, documentation: str, field: str) -> EngineStatsFamily:
        return self._engine_series(CounterMetricFamily, name, documentation, field)

    def _engine_series(
        self,
        family: Callable[..., GaugeMetricFamily | CounterMetricFamily],
        name: str,
        documentation: str,
        field: str,
    ) -> EngineStatsFamily:
        """One per model, the `EngineStats` field `field` of its engine."""
        return self.engine_series(
            EngineStatsFamily(family, name, documentation, operator.attrgetter(field))
        )

    def engine_series(self, series: _Family) -> _Family:
        """Register `series`, read from the engines once watch_llm_engines names them."""
        self._registry.register(series)
        self.engine_families.append(series)
        return series


class FerryMetrics:
    """One instance per app, on its own registry (tests build many apps in one process)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        priority_levels: tuple[int, ...] = DEFAULT_PRIORITY_LEVELS,
    ) -> None:
        self.priority_levels = priority_levels
        # Per-request writes (in flight, answered), made once per loop turn.
        self.turn_writes = TurnWrites()
        # `_created` series double the series count and no dashboard uses them.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
        self.registry = registry or CollectorRegistry()
        # Per-model children bound by observers (model -> children): forget_model drops them.
        self.bound_by_model: list[dict[str, Any]] = []
        new = _Declare(self.registry)
        self.requests = new.counter(
            "ferry_requests_total",
            "HTTP requests answered, by model, endpoint and status code.",
            ("model", "endpoint", "status"),
        )
        self.request_duration = new.histogram(
            "ferry_request_duration_seconds",
            "Time from request received to response sent.",
            ("model", "endpoint"),
        )
        self.connections_refused = new.counter(
            "ferry_connections_refused",
            "Connections answered and closed before reaching the app: a head or body too slow "
            "(408), a head too large (431), or over max_connections (503).",
            ("reason",),
        )
        for reason in REFUSAL_REASONS:  # every series from the start: rate() and alerts see 0
            self.connections_refused.labels(reason)
        # The two children every answer writes, by model then (endpoint, status): bound once,
        # not looked up per request (prometheus_client's `labels` takes a lock and a tuple).
        self._answers: dict[str, dict[tuple[str, int], tuple[Any, Any]]] = {}
        self.bound_by_model.append(self._answers)
        self.in_flight = new.gauge(
            "ferry_in_flight_requests", "HTTP requests being handled now.", ("endpoint",)
        )
        # Written by the API processes only (api_servers > 1): their sum.
        self.engine_unanswered = new.gauge(
            "ferry_engine_unanswered_bytes",
            "Bytes of requests the API processes sent to the engine process that it has not "
            "answered yet; past engine_window_bytes (per API process) new requests get a 429.",
            (),
        )
        self.engine_shm_used = new.gauge(
            "ferry_engine_shm_used_bytes",
            "Bytes of the API processes' shared memory arenas held by requests the engine "
            "process has not answered yet (their tensors of at least engine_shm_min_bytes).",
            (),
        )
        self.engine_shm_fallbacks = new.counter(
            "ferry_engine_shm_fallbacks",
            "Requests whose large tensors crossed to the engine process through the socket "
            "because their API process's arena had no room (engine_shm_arena_bytes).",
            (),
        )
        self.queue_wait = new.histogram(
            "ferry_queue_wait_seconds",
            "Time a request waited in the batcher's queue, by priority level.",
            ("model", "priority"),
        )
        self.queue_depth = new.gauge(
            "ferry_queue_depth", "Requests waiting in the batcher's queue."
        )
        self.queue_capacity = new.gauge(
            "ferry_queue_capacity", "Bound of the batcher's queue (requests)."
        )
        self.batch_size = new.histogram(
            "ferry_batch_size_requests",
            "Requests per dispatched batch.",
            buckets=BATCH_SIZE_BUCKETS,
        )
        self.batch_rows = new.counter(
            "ferry_batch_rows",
            "Rows run in batches: a plain graph's request may carry many, an encoder's text is "
            "one (Triton's inference_count).",
        )
        self.batch_tokens = new.histogram(
            "ferry_batch_padded_tokens",
            "Padded tokens per batch (batch size x longest).",
            buckets=BATCH_TOKEN_BUCKETS,
        )
        self.padding_ratio = new.histogram(
            "ferry_batch_padding_ratio",
            "Share of a batch's padded tokens that are padding.",
            buckets=RATIO_BUCKETS,
        )
        self.backend_duration = new.histogram(
            "ferry_backend_inference_seconds",
            "Time the backend took to run one batch.",
            ("model", "backend"),
        )
        self.backend_failures = new.counter(
            "ferry_backend_failures_total",
            "Batches whose backend call failed.",
            ("model", "backend"),
        )
        self.rejections = new.counter(
            "ferry_rejections_total",
            "Requests not served, by reason (queue_full, deadline, invalid, cancelled, closed).",
            ("model", "reason"),
        )
        self.cost_coefficient = new.gauge(
            "ferry_cost_model_coefficient",
            "Learned batch cost: seconds = fixed + per_request*n + per_token*n*L "
            "+ per_token_squared*n*L^2 + batch_tokens_squared*(n*L)^2.",
            ("model", "term"),
            across_processes="mostrecent",  # each replica learns its own: one of them, not a sum
        )
        self.cost_error = new.histogram(
            "ferry_cost_model_error_ratio",
            "|predicted - actual| / actual batch duration of the learned cost model.",
            buckets=(*RATIO_BUCKETS, 1.5, 2.0, 5.0),
        )
        self.model_ready = new.gauge(
            "ferry_model_ready",
            "1 when the model is loaded, warm and its backend healthy (in every replica).",
            across_processes="min",
        )

        # Per process (server/gc_pauses.py); with API processes, summed over all of them.
        self.gc_pause = new.histogram(
            "ferry_gc_pause_seconds",
            "Python garbage collections of the serving processes, by generation: each stops "
            "the event loop and the threads that start batches.",
            ("generation",),
            buckets=PAUSE_BUCKETS_S,
        )
        # Per process (server/loop_lag.py), by its role: the API processes' or replicas'
        # summed, the engine process's apart (it forms the batches and feeds the device).
        self.event_loop_lag = new.histogram(
            "ferry_event_loop_lag_seconds",
            "How late the event loop of a serving process ran a timer that was due: what a "
            "request, probe or batch arriving then waited before the loop got to it. `process`: "
            "server (one process), api, replica or engine.",
            ("process",),
            buckets=PAUSE_BUCKETS_S,
        )
        self.gc_frozen_objects = Gauge(
            "ferry_gc_frozen_objects",
            "Objects built at start-up and frozen out of the garbage collector's walks; with "
            "API processes the fewest of any serving process (0: one has not frozen its heap).",
            registry=self.registry,
            multiprocess_mode="min",
        )

        # ferry_gpu_*: per GPU, read from NVML at scrape time; absent without a GPU.
        self.registry.register(GpuCollector(load_nvml()))

        self.llm_ttft = new.histogram(
            "ferry_llm_time_to_first_token_seconds", "Time from request to its first token."
        )
        self.llm_itl = new.histogram(
            "ferry_llm_inter_token_latency_seconds", "Time between consecutive tokens."
        )
        self.llm_duration = new.histogram(
            "ferry_llm_request_duration_seconds", "Time from request to its last token."
        )
        self.llm_prompt_tokens = new.counter(
            "ferry_llm_prompt_tokens_total", "Prompt tokens of finished generations."
        )
        self.llm_generation_tokens = new.counter(
            "ferry_llm_generation_tokens_total", "Tokens generated, counted as they stream."
        )
        self.llm_finished = new.counter(
            "ferry_llm_requests_finished_total",
            "Finished generations by finish reason (stop, length, abort, rejected, error).",
            ("model", "finish_reason"),
        )
        self.llm_structured = new.counter(
            "ferry_llm_structured_requests_total",
            "Requests with constrained output, by kind: json_object, json_schema, guided_json, "
            "guided_regex, guided_choice, guided_grammar or tools.",
            ("model", "kind"),
        )
        # onnxruntime-genai computes grammar masks inside its step and exposes no timing: the
        # inter-token latency of guided generations, against all of them, shows what masks cost.
        self.llm_guided_itl = new.histogram(
            "ferry_llm_guided_inter_token_latency_seconds",
            "Time between consecutive tokens of generations under a grammar.",
        )

        # Read from the engines' own counts at scrape time (watch_llm_engines).
        self.llm_running = new.engine_gauge(
            "ferry_llm_requests_running", "Generations the engine is running now.", "running"
        )
        self.llm_waiting = new.engine_gauge(
            "ferry_llm_requests_waiting",
            "Generations waiting for a place in the engine.",
            "waiting",
        )
        # vLLM's vllm:prefix_cache_queries / vllm:prefix_cache_hits, in prompt tokens.
        self.llm_prefix_cache_queries = new.engine_counter(
            "ferry_llm_prefix_cache_queries",
            "Prompt tokens looked up in the engine's prefix cache.",
            "prefix_cache_queries",
        )
        self.llm_prefix_cache_hits = new.engine_counter(
            "ferry_llm_prefix_cache_hits",
            "Prompt tokens found computed in the engine's prefix cache (not recomputed).",
            "prefix_cache_hits",
        )
        # vLLM's vllm:spec_decode_num_draft_tokens / _accepted_tokens: their ratio is the draft
        # acceptance rate (`spec_tokens`, n-gram speculation).
        self.llm_spec_draft_tokens = new.engine_counter(
            "ferry_llm_spec_decode_draft_tokens",
            "Tokens speculation drafted (prompt lookup) for a verify step to check.",
            "spec_draft_tokens",
        )
        self.llm_spec_accepted_tokens = new.engine_counter(
            "ferry_llm_spec_decode_accepted_tokens",
            "Drafted tokens the verify step accepted (each one a decode step saved).",
            "spec_accepted_tokens",
        )
        # The Gateway API Inference Extension's model-server protocol, for its endpoint picker
        # (deploy/k8s/endpoint-picker.yaml): the KVCacheUtilization gauge and the LoRA info.
        self.llm_kv_cache_usage = new.engine_gauge(
            "ferry_llm_kv_cache_usage_ratio",
            "KV positions the running generations hold over those the engine admits (running "
            "slots x context length), 0 to 1; cached prefixes not in use count as free.",
            "kv_cache_usage",
        )
        self.llm_lora_info = new.engine_series(
            LoRAInfoFamily(
                "ferry_llm_lora_requests_info",
                "LoRA adapters in the labels (vLLM's lora_requests_info): running_lora_adapters "
                "loaded and ready, waiting_lora_adapters named by waiting generations, max_lora "
                "as many as are loaded (Ferry loads none on request); the value is the scrape's "
                "Unix time.",
            )
        )
        self._engine_families = tuple(new.engine_families)

    def watch_llm_engines(self, stats: Callable[[], Mapping[str, EngineStats]]) -> None:
        """Read the ferry_llm_* engine series from `stats` at scrape time."""
        for family in self._engine_families:
            family.source = stats

    def current(self) -> CollectorRegistry:
        """The registry with this loop turn's writes made (server/turn_writes.py): what a
        reading of it (a scrape, the console) shows."""
        self.turn_writes.flush()
        return self.registry

    def request_answered(
        self,
        model: str,
        endpoint: str,
        status: int,
        seconds: float,
        exemplar: dict[str, str] | None = None,
    ) -> None:
        """One answered request: ferry_requests_total and ferry_request_duration_seconds."""
        by_answer = self._answers.get(model)
        if by_answer is None:
            by_answer = self._answers[model] = {}
        children = by_answer.get((endpoint, status))
        if children is None:
            children = by_answer[(endpoint, status)] = (
                self.requests.labels(model, endpoint, str(status)),
                self.request_duration.labels(model, endpoint),
            )
        if exemplar is None:
            self.turn_writes.add(children[0], 1)
            self.turn_writes.observe(children[1], seconds)
            return
        children[0].inc()
        children[1].observe(seconds, exemplar)

    def forget_model(self, model: str) -> None:
        """Drop every series labelled with `model` (an unloaded LoRA adapter, whose name came
        from a request): prometheus_client's own label removal, and the children bound for it.
        In multiprocess mode (`api_servers` > 1) the values live in the processes' files,
        which prometheus_client cannot remove from; `ServedSeries` leaves them out of scrapes."""
        for bound in self.bound_by_model:
            bound.pop(model, None)
        if os.environ.get(MULTIPROC_ENV):
            return
        for metric in vars(self).values():
            if isinstance(metric, MetricWrapperBase) and "model" in metric._labelnames:
                metric.remove_by_labels({"model": model})

    def connection_refused(self, reason: RefusalReason) -> None:
        self.connections_refused.labels(reason).inc()

    def batch_observer(self, model: str, backend: str) -> ModelBatchObserver:
        return ModelBatchObserver(self, model, backend)


class ServedSeries:
    """What /metrics shows of a registry: every series, less those whose `model` label is not
    a served name (an unloaded LoRA adapter's, still in a multiprocess file or written by a
    request that ended as the adapter went). So every label value on /metrics is a configured
    name or a loaded adapter's, never left over from a request."""

    def __init__(self, registry: CollectorRegistry, served: Collection[str]) -> None:
        self._registry = registry
        self._served = {*served, ""}  # "": requests that named no served model

    def collect(self) -> Iterator[Metric]:
        served = self._served
        for metric in self._registry.collect():
            kept = [s for s in metric.samples if s.labels.get("model", "") in served]
            if len(kept) != len(metric.samples):
                metric = _with_samples(metric, kept)
            yield metric


def _with_samples(metric: Metric, samples: list[Any]) -> Metric:
    trimmed = Metric(metric.name, metric.documentation, metric.type, metric.unit)
    trimmed.samples = samples
    return trimmed


def priority_label(priority: int, levels: tuple[int, ...]) -> str:
    """A configured level's own label; any other priority "other": the label set stays bounded
    whatever numbers clients send."""
    return str(priority) if priority in levels else "other"


class ModelBatchObserver:
    """The batcher's `BatchObserver`, bound to one model's label values."""

    def __init__(self, metrics: FerryMetrics, model: str, backend: str) -> None:
        self._depth = metrics.queue_depth.labels(model)
        self._turn_writes = metrics.turn_writes
        self._waits = {
            level: metrics.queue_wait.labels(model, str(level)) for level in metrics.priority_levels
        }
        self._other_wait = metrics.queue_wait.labels(model, "other")
        self._size = metrics.batch_size.labels(model)
        self._rows = metrics.batch_rows.labels(model)
        self._tokens = metrics.batch_tokens.labels(model)
        self._padding = metrics.padding_ratio.labels(model)
        self._duration = metrics.backend_duration.labels(model, backend)
        self._failures = metrics.backend_failures.labels(model, backend)
        # Bounded label values (reasons, cost terms): children made on first use, then reused.
        self._rejections = functools.cache(functools.partial(metrics.rejections.labels, model))
        self._cost_coefficient = functools.cache(
            functools.partial(metrics.cost_coefficient.labels, model)
        )
        self._cost_error = metrics.cost_error.labels(model)

    def queue_depth(self, depth: int) -> None:
        # The turn's last depth (what a scrape would read): every request changes it twice.
        self._turn_writes.set(self._depth, depth)

    def rejected(self, reason: RejectReason) -> None:
        self._rejections(reason).inc()

    def batch_formed(self, batch: FormedBatch) -> None:
        self._size.observe(batch.size)
        self._rows.inc(batch.rows)
        self._tokens.observe(batch.padded_tokens)
        self._padding.observe(1 - batch.real_tokens / batch.padded_tokens)
        observe_all(self._waits.get(batch.priority, self._other_wait), batch.queue_waits_s)

    def batch_finished(self, seconds: float, failed: bool, predicted_s: float | None) -> None:
        self._duration.observe(seconds)
        if failed:
            self._failures.inc()
        elif predicted_s is not None and seconds > 0:
            self._cost_error.observe(abs(predicted_s - seconds) / seconds)

    def cost_model(self, coefficients: dict[str, float]) -> None:
        for term, value in coefficients.items():
            self._cost_coefficient(term).set(value)


class EngineStatsFamily(Collector):
    """One ferry_llm_* series per engine, read from the engine's own counts when Prometheus
    scrapes. prometheus_client's answer for values another component owns is a custom collector
    (as its process and platform collectors, and Ferry's GPU one, read theirs): nothing on the
    request path, nothing written by the /metrics handler, and a counter is exactly the engine's
    running total (a restarted engine starts again from zero, which rate() understands)."""

    def __init__(
        self,
        family: Callable[..., GaugeMetricFamily | CounterMetricFamily],
        name: str,
        documentation: str,
        read: Callable[[EngineStats], float | None],
    ) -> None:
        self._family, self._name, self._documentation = family, name, documentation
        self._read = read
        self.source: Callable[[], Mapping[str, EngineStats]] = dict  # no engines yet

    def _new(self) -> GaugeMetricFamily | CounterMetricFamily:
        return self._family(self._name, self._documentation, labels=["model"])

    def describe(self) -> list[Metric]:
        return [self._new()]  # the name only: registering reads no engine

    def collect(self) -> list[Metric]:
        family = self._new()
        for model, stats in self.source().items():
            value = self._read(stats)
            if value is not None:  # None: the engine does not know it; no series, not a 0
                family.add_metric([model], value)
        return [family]


class LoRAInfoFamily(EngineStatsFamily):
    """The model-server protocol's LoRA info: one series per model, its adapters in the labels.
    The value is the scrape's time, as vLLM's is its last update's: the endpoint picker reads the
    series with the highest value, and Ferry writes one a model, always current.

    `max_lora` is the number loaded, not the configured most (`max_adapters`): the picker takes
    max_lora above the adapters running as room to load the one a request names, and sends it
    there; vLLM would load it, but Ferry serves only adapters loaded beforehand (a 404 otherwise),
    so a Ferry pod has no such room."""

    LABELS = ("model", "running_lora_adapters", "waiting_lora_adapters", "max_lora")

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(GaugeMetricFamily, name, documentation, lambda _: None)

    def _new(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self._name, self._documentation, labels=self.LABELS)

    def collect(self) -> list[Metric]:
        family, now = self._new(), time.time()
        for model, stats in self.source().items():
            running, waiting = stats.running_lora_adapters, stats.waiting_lora_adapters
            labels = [model, ",".join(running), ",".join(waiting), str(len(running))]
            family.add_metric(labels, now)
        return [family]


class LLMMetricsObserver:
    """The OpenAI serving layer's `LLMObserver`, writing the ferry_llm_* series."""

    def __init__(self, metrics: FerryMetrics) -> None:
        self._m = metrics
        self._models: dict[str, ModelLLMObserver] = {}
        metrics.bound_by_model.append(self._models)

    def for_model(self, model: str) -> ModelLLMObserver:
        """The model's label values bound once (a dict lookup per request, none per token)."""
        bound = self._models.get(model)
        if bound is None:
            bound = self._models[model] = ModelLLMObserver(self._m, model)
        return bound


class ModelLLMObserver:
    """A `GenerationObserver` for one model: its ferry_llm_* children, bound once."""

    def __init__(self, metrics: FerryMetrics, model: str) -> None:
        self._ttft = metrics.llm_ttft.labels(model)
        self._itl = metrics.llm_itl.labels(model)
        self._guided_itl = metrics.llm_guided_itl.labels(model)
        self._duration = metrics.llm_duration.labels(model)
        self._prompt_tokens = metrics.llm_prompt_tokens.labels(model)
        self._generated = metrics.llm_generation_tokens.labels(model)
        # Bounded label values (finish reasons, structured kinds): children made on first use.
        self._finished = functools.cache(functools.partial(metrics.llm_finished.labels, model))
        self._structured = functools.cache(functools.partial(metrics.llm_structured.labels, model))

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)
        self._generated.inc()

    def token(self, seconds_since_last: float) -> None:
        self._itl.observe(seconds_since_last)
        self._generated.inc()

    def guided_token(self, seconds_since_last: float) -> None:
        self._guided_itl.observe(seconds_since_last)

    def structured(self, kind: str) -> None:
        self._structured(kind).inc()

    def finished(self, reason: str, prompt: int, generated: int, seconds: float) -> None:
        self._duration.observe(seconds)
        self._prompt_tokens.inc(prompt)
        self._finished(reason).inc()
