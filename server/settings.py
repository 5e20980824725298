"""Configuration, read once in the app factory and passed down (never at import time).

Sources, later ones winning: defaults, a TOML or YAML file, then environment variables:
`FERRY_<FIELD>` for server fields (FERRY_PORT=9000) and `FERRY_MODEL__<NAME>__<FIELD>` for a
model's fields, NAME upper-cased with non-alphanumerics as `_`, tables entered with `__`
(FERRY_MODEL__ALL_MINILM_L6_V2__BATCHING__MAX_BATCH_SIZE=64). A list, tuple or table field takes
JSON (FERRY_MODEL__M__PAD_AXES='[]', FERRY_MODEL__M__PAD_VALUES='{"mask": -1}', `null` where it
may be unset); a list or tuple also takes comma-separated items (FERRY_CORS_ALLOW_ORIGINS=a,b).
A value the settings refuse is named by its variable. Durations are in seconds (`_s`).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from ferry.backends.image_spec import ImagePreprocess
from ferry.backends.options import BackendOptions, OnnxRuntimeOptions
from ferry.batcher.policy import BatchLimits
from ferry.llm.options import ENGINE_OPTIONS, EngineOptions, OrtGenAIOptions, engine_options
from ferry.server.metrics import DEFAULT_PRIORITY_LEVELS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SequenceControl = Literal["start", "end", "ready", "corrid"]


class ImplicitState(_Strict):
    """Triton's implicit state: a graph input the server fills with the graph output of the
    sequence's previous request (zeros, in the input's shape with its dynamic axes 1, on the
    sequence's first request)."""

    input: str = Field(min_length=1)  # the graph input the server fills (clients never send it)
    output: str = Field(min_length=1)  # the graph output kept for the sequence's next request


class SequenceBatching(_Strict):
    """A stateful graph's sequence batching, as Triton's `sequence_batching` section
    (server/sequences.py): requests carry `sequence_id` (and `sequence_start`, `sequence_end`),
    each sequence's requests run one at a time in their order, and the control inputs and
    implicit state are filled by the server (clients do not send them)."""

    # oldest: requests of different sequences batch, oldest first, with up to
    # max_candidate_sequences sequences in progress; direct: each sequence holds one of
    # max_batch_size x sessions slots. Others wait in a backlog for a sequence to end.
    strategy: Literal["oldest", "direct"] = "oldest"
    # oldest: sequences in progress at once, per session (Triton's, default max_batch_size).
    max_candidate_sequences: int | None = Field(default=None, ge=1)
    # A sequence with no request for this long is ended; its next request must START again
    # (Triton's max_sequence_idle_microseconds, default 1 s).
    max_sequence_idle_s: float = Field(default=1.0, gt=0)
    # Graph inputs the server fills, by name: start, end, ready (1 or 0 in the input's
    # datatype) and corrid (the sequence id: an integer input takes an integer id, a BYTES one
    # a string id).
    controls: dict[str, SequenceControl] = Field(default_factory=dict)
    # Implicit state: input/output pairs the server keeps per sequence (Triton's `state`).
    state: tuple[ImplicitState, ...] = ()

    @model_validator(mode="after")
    def _check_names(self) -> SequenceBatching:
        inputs = [*self.controls, *(s.input for s in self.state)]
        if len(inputs) != len(set(inputs)):
            raise ValueError(f"an input is named twice among controls and state: {inputs}")
        kinds = list(self.controls.values())
        if len(kinds) != len(set(kinds)):
            raise ValueError(f"a control kind is given to two inputs: {self.controls}")
        if self.max_candidate_sequences is not None and self.strategy != "oldest":
            raise ValueError("max_candidate_sequences is the oldest strategy's")
        return self


class ModelSettings(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._:-]+$")  # the name clients use
    # Folder with model.onnx, tokenizer.json and ferry_model.json (written by `ferry export`);
    # for `torch`, a Hugging Face encoder folder (config.json, weights, tokenizer.json); or a
    # plain ONNX graph (an .onnx file, or a folder of one without ferry_model.json), served as
    # named tensors in and out (server/graph_runtime.py).
    path: Path
    # Outputs returned by /predict unless the request asks for others (a plain graph: all of
    # its outputs unless set).
    outputs: tuple[str, ...] = ("sentence_embedding",)
    # A request's deadline unless it sets its own: past it, 504 (queued work is dropped).
    timeout_s: float = Field(default=30.0, gt=0)
    # A batch still running after this fails with 504; the backend is presumed hung.
    infer_timeout_s: float = Field(default=60.0, gt=0)
    # What runs the model, `kind` choosing which (the `[models.backend]` tables below).
    backend: BackendOptions = OnnxRuntimeOptions()
    # A plain graph's dynamic axes (by name) that are padding-safe: requests are padded along
    # them to share a batch. None: the axes a mask input has (mask_inputs), provided every
    # output axis is tied to an input axis by name (so it can be cut back). Requests differing
    # on any other axis never share a batch (backends/batch_plan.py).
    pad_axes: tuple[str, ...] | None = None
    # A plain graph's inputs that mask their axes (padding there is hidden from the model);
    # None: those whose name has "mask" in it (attention_mask, key_padding_mask, ...).
    mask_inputs: tuple[str, ...] | None = None
    # The axis of a plain graph's inputs that holds its rows (a sequence-first RNN's 1): requests
    # stack along it, and each output's rows are found on its axis of the same name.
    batch_axis: int = Field(default=0, ge=0)
    # A plain graph with nodes that compute across rows (dynamic int8 quantization, a
    # reduction over axis 0) is served one request at a time; true batches it anyway, each
    # answer then depending slightly on its neighbours.
    accept_neighbour_dependence: bool = False
    # A plain graph's inputs padded with other than 0 along their dynamic axes (by input name).
    pad_values: dict[str, float] = Field(default_factory=dict)
    # A plain graph's class labels by output, in its classes' order: the names KServe's
    # classification extension (`parameters.classification`) gives them (a ZipMap's own keys
    # when unset).
    labels: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # A plain graph's image preprocessing (decode, resize, crop, normalise), over what the
    # graph's `ferry.preprocess` metadata declares (backends/image_spec.py).
    preprocess: ImagePreprocess | None = None
    # A stateful plain graph's sequence batching (Triton's `sequence_batching`); unset: each
    # request stands alone, and one carrying a sequence_id is refused.
    sequence_batching: SequenceBatching | None = None
    # The batcher's limits, with its own defaults; how many batches run at once is the
    # backend's to say (ONNX Runtime sessions, Triton concurrency), so it is not set here.
    batching: BatchLimits = BatchLimits()

    @field_validator("batching", mode="before")
    @classmethod
    def _batching_table(cls, batching: Any) -> Any:
        """What runs at once is the backend's to say; "none" is TOML's null."""
        if isinstance(batching, dict) and "max_concurrent_batches" in batching:
            raise ValueError(
                "batching.max_concurrent_batches is the backend's: backend.sessions "
                "(onnxruntime) or backend.concurrency (triton)"
            )
        if isinstance(batching, dict) and "prepared_batches" in batching:
            raise ValueError("batching.prepared_batches is the backend's (queues_batches)")
        if isinstance(batching, dict) and batching.get("fairness_window") == "none":
            # TOML has no null: "none" turns the window off (groups from the whole queue).
            batching = {**batching, "fairness_window": None}
        return batching


_SERVED_NAME = r"^[A-Za-z0-9._:/-]+$"


class LLMSettings(_Strict):
    """A chat/completions model behind the OpenAI-compatible routes."""

    # The name clients give as `model`; each adapter adds a name of its own.
    name: str = Field(min_length=1, pattern=_SERVED_NAME)
    # ortgenai: an onnxruntime-genai model folder (CPU); vllm: a Hugging Face folder (GPU hosts).
    path: Path
    # The engine and its own settings (llm/options.py), written as keys of this table beside
    # the others (`engine = "vllm"`, `gpu_memory_utilization = 0.5`), never as `options`.
    options: EngineOptions = OrtGenAIOptions()
    # Prefix reuse (vLLM's automatic prefix caching): a prompt sharing a prefix with a recent one
    # computes only the rest, within its tenant (server/tenancy.py). ortgenai: prompts' keys and
    # values kept within the server's prefix_cache_bytes, least recently used evicted first;
    # vllm: enable_prefix_caching.
    prefix_cache: bool = True
    # Greedy text that does not depend on what else runs. vllm: its batch-invariant kernels
    # (VLLM_BATCH_INVARIANT=1); ortgenai: decode steps never run a lone row, whose int4 kernel
    # rounds differently (slower at one stream; docs/apis.md, "The onnxruntime-genai engine").
    batch_invariant: bool = False
    # LoRA adapters, each served as a model of its own name (ortgenai: an .onnx_adapter file for
    # a model exported with LoRA inputs; vllm: a peft folder). max_adapters: loaded at once, also
    # vLLM's max_loras. adapter_dir: POST /v1/load_lora_adapter loads only from inside it (unset:
    # runtime loading is off for this model).
    adapters: dict[Annotated[str, Field(pattern=_SERVED_NAME)], Path] = Field(default_factory=dict)
    # Adapters loaded at once (configured and runtime-loaded together); vLLM's max_loras.
    max_adapters: int = Field(default=4, ge=1)
    # The folder POST /v1/load_lora_adapter may load from; unset: runtime loading is off.
    adapter_dir: Path | None = None
    # Off: the model's special tokens typed inside message content are read as text, so a user
    # cannot open a new turn or role (role injection). On only for clients trusted to send them.
    special_tokens_in_content: bool = False

    @model_validator(mode="before")
    @classmethod
    def _engine_options(cls, data: Any) -> Any:
        """The flat table's engine keys into `options`, the one place they are read from."""
        if not isinstance(data, Mapping):
            return data
        if "options" in data:
            raise ValueError("options: an engine's settings are keys of the table itself")
        options, rest = engine_options(data)
        return {**rest, "options": options}

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Dumped flat, as the table is written: validated again, the same settings."""
        fields: dict[str, Any] = handler(self)
        options = fields.pop("options", {})
        return {**fields, **options}

    @property
    def engine(self) -> str:
        return self.options.engine

    @model_validator(mode="after")
    def _check_adapters(self) -> LLMSettings:
        if len(self.adapters) > self.max_adapters:
            raise ValueError(f"{len(self.adapters)} adapters but max_adapters={self.max_adapters}")
        return self

    @model_validator(mode="after")
    def _check_speculation(self) -> LLMSettings:
        # A lone request speculates, and a checking pass rounds as a prompt does: its greedy text
        # would depend on whether it runs alone, the very thing batch_invariant rules out.
        speculates = isinstance(self.options, OrtGenAIOptions) and self.options.spec_tokens > 0
        if self.batch_invariant and speculates:
            raise ValueError("spec_tokens: speculation cannot be combined with batch_invariant")
        return self


def setting_location(where: Sequence[str | int]) -> tuple[str | int, ...]:
    """A pydantic error's location as the settings are written: an LLM's engine options are
    flat keys (llm_models.0.max_running, not llm_models.0.options.ortgenai.max_running).
    `where` is Settings' location of the error, or an LLMSettings' own."""
    parts = tuple(where)
    for at in (0, 2):
        if parts[at : at + 1] == ("options",) and (at == 0 or parts[0] == "llm_models"):
            tagged = len(parts) > at + 1 and parts[at + 1] in ENGINE_OPTIONS
            return parts[:at] + parts[at + (2 if tagged else 1) :]
    return parts


class Settings(_Strict):
    host: str = "127.0.0.1"  # the address to bind; 0.0.0.0 for every interface
    port: int = Field(default=8000, ge=0, le=65535)  # the HTTP port to bind
    log_level: Literal["debug", "info", "warning", "error"] = "info"  # Ferry's and uvicorn's
    # "json": one JSON object a line (time, level, logger, message, request_id, exc_info), for
    # Ferry's and uvicorn's loggers alike (server/logs.py).
    log_format: Literal["text", "json"] = "text"
    # OpenTelemetry traces (docs/observability.md): the OTLP endpoint spans go to, e.g.
    # "http://collector:4318/v1/traces" (http/protobuf, the default) or "http://collector:4317"
    # with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc; sampler, service name and exporter options
    # from the standard OTEL_* variables. Empty: no tracing, and the SDK is not loaded.
    otlp_traces_endpoint: str = ""
    # Per-request bounds, checked before any work (docs/configuration.md's `[server]` table).
    # A larger body gets 413.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # More items (texts, id lists, prompts, messages) in one request get 422 (400 on /v1).
    max_items_per_request: int = Field(default=256, ge=1)
    # A longer text (or prompt, or message) gets 422 before it is tokenized.
    max_chars_per_text: int = Field(default=100_000, ge=1)
    # Estimated JSON size of an answer (e.g. last_hidden_state for many long items).
    max_response_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Connections: beyond `max_connections` new ones get 503; slow or idle clients are closed.
    max_connections: int = Field(default=2048, ge=1)
    # A request head that takes longer gets 408 and a close (so does a connection never sending).
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)  # a body that takes longer: 408 and a close
    # An idle keep-alive connection is closed after this (not one whose next request is waiting).
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)  # a larger request head gets 431
    max_headers: int = Field(default=100, ge=8)  # a head of more lines gets 431
    # uvicorn's per-request access log costs the event loop ~7% of its time; off unless asked.
    access_log: bool = False
    # KServe v2 inference on a graph served from the connection's protocol, without an ASGI
    # cycle or a coroutine per request, where nothing but the handler would act on the request
    # (server/direct_lane.py; off with tracing or API keys); false: every request via the gateway.
    direct_lane: bool = True
    # On shutdown (or a model's unload), how long queued and running work may take to finish.
    drain_timeout_s: float = Field(default=20.0, ge=0)
    default_model: str = ""  # the model a request that names none gets; empty: the first model
    # Security: a Bearer key for inference endpoints (as vLLM's and TGI's --api-key); health and
    # metrics stay open for probes and scrapers unless asked otherwise. CORS is off by default.
    api_key: str = ""
    # More keys, each a tenant of its own (server/tenancy.py: prefix cache scopes, priority):
    # name -> key. `api_key`, when set, is the tenant "default".
    api_keys: dict[Annotated[str, Field(min_length=1, max_length=64)], str] = Field(
        default_factory=dict
    )
    # Who may ask for a priority below 0, more urgent than the default: names of keys, or "*"
    # for every request (keyed or not). Anyone else's is refused (403 naming `priority`), or
    # with "clamp" run at 0 and said so in the `ferry-priority-clamped` response header.
    priority_keys: tuple[str, ...] = ()
    # What a priority below 0 from anyone not in priority_keys gets: a 403, or run at 0.
    priority_below_default: Literal["refuse", "clamp"] = "refuse"
    # With keys set: names of the keys that may load and unload LoRA adapters at runtime
    # (/v1/load_lora_adapter, /v1/unload_lora_adapter), or "*" for every key; others get 403.
    # Without keys anyone may, as in vLLM. Adapters in this file are never unloaded by a client.
    adapter_keys: tuple[str, ...] = ()
    # With keys set: names of the keys that may load and unload models (Triton's model
    # repository extension, model_control_mode = "explicit"), or "*" for every key; others 403.
    model_control_keys: tuple[str, ...] = ()
    api_key_protects_health: bool = False  # the health routes also need a key
    api_key_protects_metrics: bool = False  # /metrics also needs a key
    # Origins allowed by CORS (comma-separated in the environment); empty: CORS is off.
    cors_allow_origins: tuple[str, ...] = ()
    # The console at /console: live batching charts, a playground for every served model and
    # their signatures (docs/observability.md). Its page is open; what it shows comes from
    # routes behind the API key, which it asks for.
    console: bool = True
    # More tokens in one encoder request (every item's together) get 422.
    max_tokens_per_request: int = Field(default=65536, ge=1)
    # Grammars (response_format, guided_*, tools) are checked off the event loop, in
    # `grammar_workers` processes that a crash or a timeout costs nothing but a 400; each
    # refusal names the bound it hit. The defaults keep llguidance inside its own ParserLimits,
    # which the engine's matchers enforce mid-generation (docs/apis.md "Structured outputs").
    # This one: the characters of a grammar's text (a JSON schema, Lark, a regex).
    grammar_max_chars: int = Field(default=131_072, ge=1)
    grammar_max_rules: int = Field(default=1000, ge=1)  # Lark/GBNF rules, JSON subschemas
    grammar_max_depth: int = Field(default=64, ge=1)  # nested groups, JSON levels
    grammar_max_repeat: int = Field(default=10_000, ge=1)  # `{n}` counts, nested ones multiplied
    grammar_max_alternatives: int = Field(default=1000, ge=1)  # anyOf/enum/choices/`|`, tools
    # A grammar still compiling after this costs only its worker and is a 400.
    grammar_compile_timeout_s: float = Field(default=10.0, gt=0)
    grammar_workers: int = Field(default=2, ge=1, le=64)  # processes that check grammars
    grammar_cache_entries: int = Field(default=512, ge=0)  # checked grammars kept (LRU)
    # How long a thread that wants the GIL waits before the one holding it must let go
    # (sys.setswitchinterval), in every server process. Python's 5 ms default made a device's
    # stream thread wait up to 5 ms to launch and again to hand back each batch while the busy
    # event loop held the GIL (docs/batching.md "The GIL's switch interval").
    gil_switch_interval_ms: float = Field(default=0.5, gt=0, le=100)
    # KServe v2 gRPC (tritonclient.grpc, perf_analyzer -i grpc) on its own port; off unless set.
    grpc_port: int | None = Field(default=None, ge=0, le=65535)
    # Triton's system shared memory extension (/v2/systemsharedmemory, gRPC SystemSharedMemory*):
    # off unless set, as Triton's --allow-client-shm, since a client that may register a region
    # can read any /dev/shm object the server's user can open.
    allow_client_shm: bool = False
    # The server's name in KServe's server metadata (GET /v2, gRPC ServerMetadata); Triton's
    # example clients check for "triton".
    kserve_server_name: str = Field(default="ferry", min_length=1, max_length=64)
    # Request priorities with their own ferry_queue_wait_seconds series (others: "other"), so
    # the label set stays bounded whatever clients send.
    priority_levels: tuple[int, ...] = DEFAULT_PRIORITY_LEVELS
    # API server processes in front of one engine process (server/procs); 1: one process.
    # Neither this nor replicas set: both chosen from the models and the host at `ferry serve`
    # (server/layout_choice.py; the start-up log says which and why).
    api_servers: int = Field(default=1, ge=1, le=64)
    # With api_servers > 1: when the engine process has not reported (it does every 0.25 s) for
    # this long (stopped, or its event loop blocked), readiness turns 503 and the LLM streams
    # waiting on it end with a 503.
    engine_heartbeat_timeout_s: float = Field(default=5.0, gt=0)
    # With api_servers > 1: the bytes of requests (tokens, tensors) each API process may have
    # sent to the engine process and not had answered. Past it, new requests are refused at once
    # with a 429 and Retry-After, so that an engine that is stuck (or far behind) cannot fill an
    # API process's memory with requests that have timed out (what is sent cannot be taken
    # back). Raise it when a model's queue holds more than this, in bytes, at once; a request
    # larger than the window is sent when nothing else is unanswered.
    engine_window_bytes: int = Field(default=256 * 2**20, ge=0)
    # With api_servers > 1: a request's tensors of at least this many bytes cross to the engine
    # process through the API process's shared memory arena (server/procs/arena.py), smaller
    # ones through the socket (a frame costs less than a block for them). 0: every tensor
    # crosses the socket (no arena is made).
    engine_shm_min_bytes: int = Field(default=64 * 2**10, ge=0)
    # With api_servers > 1: each API process's arena in /dev/shm (reserved at start; a /dev/shm
    # too small for it turns the arena off, with a warning). A request that finds no room in it
    # sends its tensors through the socket instead.
    engine_shm_arena_bytes: int = Field(default=32 * 2**20, ge=0)
    # Full server processes on one port (server/procs/replicas.py), each with its own models,
    # batchers and backends: no process hop per request, every model held N times. For models
    # small enough to copy (tabular, small CNNs, encoders on the CPU); not with api_servers, nor
    # with llm_models (refused at start). 1: one process.
    replicas: int = Field(default=1, ge=1, le=64)
    # LoRA adapter names become model names and metric label values: bounded (their count is
    # each model's max_adapters).
    max_adapter_name_chars: int = Field(default=64, ge=1, le=1024)
    # The ortgenai engines' prefix cache: one budget for every model (ortgenai_prefix.py).
    prefix_cache_bytes: int = Field(default=512 * 2**20, ge=0)
    # Triton's model control (server/model_repository.py): the repository is this file's
    # models and llm_models. "none": all of them served, load/unload refused; "explicit": only
    # `load_models` served at start ("*": all), POST /v2/repository/models/{m}/load and
    # /unload change that; "poll": this file re-read every `repository_poll_secs`, models added,
    # changed or removed loaded, reloaded or unloaded (load/unload refused).
    model_control_mode: Literal["none", "explicit", "poll"] = "none"
    # With model_control_mode "explicit": the models served at start ("*" alone: all);
    # refused in the other modes.
    load_models: tuple[str, ...] = ()
    # With model_control_mode "poll": seconds between reads of this file.
    repository_poll_secs: float = Field(default=15.0, gt=0)
    models: tuple[ModelSettings, ...] = ()  # the `[[models]]` tables: encoders and plain graphs
    llm_models: tuple[LLMSettings, ...] = ()  # the `[[llm_models]]` tables: chat and completions
    # Where these settings were read from (load_settings), so that poll mode can read them again.
    _source: SettingsSource | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_models(self) -> Settings:
        names = [m.name for m in self.models] + [m.name for m in self.llm_models]
        names += [adapter for m in self.llm_models for adapter in m.adapters]
        if len(names) != len(set(names)):
            raise ValueError(f"model names must be unique, got {names}")
        if self.default_model and self.default_model not in names:
            raise ValueError(f"default_model {self.default_model!r} is not among {names}")
        return self

    @model_validator(mode="after")
    def _check_model_control(self) -> Settings:
        if self.load_models and self.model_control_mode != "explicit":
            raise ValueError(
                "load_models names the models served at start in model_control_mode = "
                f"'explicit'; with '{self.model_control_mode}' every model is served"
            )
        if "*" in self.load_models and len(self.load_models) > 1:
            raise ValueError("load_models: '*' (every model) must be its only entry")
        if self.model_control_mode == "explicit" and self.replicas > 1:
            raise ValueError(
                f"model_control_mode = 'explicit' with replicas = {self.replicas}: a load or "
                "unload would reach one replica only; use 'poll' (each replica follows the "
                "file) or api_servers"
            )
        names = {m.name for m in self.models} | {m.name for m in self.llm_models}
        unknown = sorted(set(self.load_models) - names - {"*"})
        if unknown:
            raise ValueError(f"load_models names models not configured: {unknown}")
        return self

    @model_validator(mode="after")
    def _check_layout(self) -> Settings:
        if self.replicas > 1 and self.api_servers > 1:
            raise ValueError(
                f"replicas = {self.replicas} and api_servers = {self.api_servers}: two layouts, "
                "set one of them (replicas: whole servers on one port, each with its own models; "
                "api_servers: API processes in front of one engine process)"
            )
        if self.replicas > 1 and self.llm_models:
            names = ", ".join(m.name for m in self.llm_models)
            raise ValueError(
                f"replicas = {self.replicas} would load every LLM (llm_models: {names}) "
                f"{self.replicas} times: serve LLMs with replicas = 1, or with api_servers to "
                "spread their front end over cores"
            )
        return self

    @model_validator(mode="after")
    def _check_sequences(self) -> Settings:
        """A sequence's state lives in one process: every request of it must reach that one."""
        stateful = [m.name for m in self.models if m.sequence_batching is not None]
        if stateful and (self.api_servers > 1 or self.replicas > 1):
            raise ValueError(
                f"models {stateful} have sequence_batching, whose sequences live in one "
                "process: serve them with api_servers = 1 and replicas = 1"
            )
        return self

    @model_validator(mode="after")
    def _check_keys(self) -> Settings:
        if self.api_key and "default" in self.api_keys:
            raise ValueError("api_keys: 'default' is api_key's name")
        keys = self.tenant_keys
        if any(not key for key in keys.values()):
            raise ValueError("api_keys: every key must be non-empty")
        if len(set(keys.values())) != len(keys):
            raise ValueError("api_keys: two tenants share a key")
        for field in ("priority_keys", "adapter_keys", "model_control_keys"):
            unknown = sorted(set(getattr(self, field)) - set(keys) - {"*"})
            if unknown:
                raise ValueError(f"{field} names no configured key: {unknown}")
        return self

    @property
    def tenant_keys(self) -> dict[str, str]:
        """Every API key by its tenant name; empty: no key, every request anonymous."""
        default = {"default": self.api_key} if self.api_key else {}
        return {**self.api_keys, **default}

    @property
    def default_model_name(self) -> str:
        return self.default_model or (self.models[0].name if self.models else "")

    def served_at_start(self) -> Settings:
        """These settings with only the models served at start: in explicit model control,
        those `load_models` names (all for "*"); else every one."""
        if self.model_control_mode != "explicit" or "*" in self.load_models:
            return self
        wanted = set(self.load_models)
        return self.model_copy(
            update={
                "models": tuple(m for m in self.models if m.name in wanted),
                "llm_models": tuple(m for m in self.llm_models if m.name in wanted),
            }
        )

    def reread(self) -> Settings:
        """The settings read again from where these came from (poll model control); these
        same ones when they were not read by load_settings."""
        if self._source is None:
            return self
        return self._source.read()


@dataclass(frozen=True)
class SettingsSource:
    """What load_settings was given: read again, it gives the settings as they are now."""

    path: Path | None
    extra_models: tuple[Mapping[str, Any], ...]
    overrides: Mapping[str, Any]

    def read(self) -> Settings:
        return load_settings(self.path, None, self.extra_models, **self.overrides)


def load_settings(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    extra_models: Sequence[Mapping[str, Any]] = (),
    **overrides: Any,
) -> Settings:
    """Build Settings from a file, the environment and explicit overrides (CLI flags);
    `extra_models` (`ferry serve --model`, paths absolute) follow the file's."""
    environ = os.environ if environ is None else environ
    if path is None and environ.get("FERRY_CONFIG"):
        path = Path(environ["FERRY_CONFIG"])
    raw: dict[str, Any] = _read_file(path) if path else {}
    base_dir = path.parent if path else Path.cwd()
    server = dict(raw.get("server", {}))
    models = [dict(m) for m in raw.get("models", [])]
    llm_models = [dict(m) for m in raw.get("llm_models", [])]
    for model in models + llm_models:
        if "path" in model and not Path(model["path"]).is_absolute():
            model["path"] = str(base_dir / model["path"])
    for model in llm_models:  # adapter paths are relative to the config file too
        if "adapter_dir" in model:
            model["adapter_dir"] = str(base_dir / model["adapter_dir"])
        if isinstance(model.get("adapters"), dict):
            model["adapters"] = {k: str(base_dir / v) for k, v in model["adapters"].items()}
    models += [dict(m) for m in extra_models]
    sources = _apply_env(server, models, llm_models, environ)
    server.update({k: v for k, v in overrides.items() if v is not None})
    for field in overrides:  # a flag wins over the environment: errors are the flag's
        sources.pop((field,), None)
    try:
        settings = Settings(**server, models=tuple(models), llm_models=tuple(llm_models))  # type: ignore[arg-type]  # pydantic validates the dicts
    except ValidationError as exc:
        named = _name_variables(exc, sources)
        if named is None:
            raise
        raise named from exc
    settings._source = SettingsSource(path, tuple(extra_models), dict(overrides))
    return settings


class SettingsError(ValueError):
    """Settings refused, each error named by the environment variable that set it."""


def _read_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        return yaml.safe_load(text) or {}
    return tomllib.loads(text)


def _env_key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper()


Location = tuple[str | int, ...]  # a value's place in Settings, as pydantic's errors give it


def _apply_env(
    server: dict[str, Any],
    models: list[dict[str, Any]],
    llm_models: list[dict[str, Any]],
    environ: Mapping[str, str],
) -> dict[Location, str]:
    """Apply FERRY_* variables; returns the variable behind each value it set."""
    sources: dict[Location, str] = {}
    for field in Settings.model_fields:
        key = f"FERRY_{field.upper()}"
        if field in ("models", "llm_models") or key not in environ:
            continue
        value = environ[key]
        if field == "api_keys":  # name=key,name=key
            pairs = [pair.split("=", 1) for pair in value.split(",")]
            if any(len(pair) != 2 for pair in pairs):
                raise SettingsError(f"{key}: comma-separated name=key pairs")
            server[field] = dict(pairs)
        else:
            server[field] = _env_value(key, value, _field_types([Settings], [field]))
        sources[(field,)] = key
    for table, cls, entries in (
        ("models", ModelSettings, models),
        ("llm_models", LLMSettings, llm_models),
    ):
        # An LLM's engine options are written flat, beside its own keys.
        classes = [cls, *ENGINE_OPTIONS.values()] if cls is LLMSettings else [cls]
        for index, model in enumerate(entries):
            # FERRY_MODEL__<NAME>__BATCHING__MAX_BATCH_SIZE: each further `__` enters a table.
            prefix = f"FERRY_MODEL__{_env_key(str(model.get('name', '')))}__"
            for key, value in environ.items():
                if not key.startswith(prefix):
                    continue
                path = key[len(prefix) :].lower().split("__")
                *tables, field = path
                target = model
                for name in tables:
                    target = target.setdefault(name, {})
                target[field] = _env_value(key, value, _field_types(classes, path))
                sources[(table, index, *path)] = key
    return sources


def _members(annotation: Any) -> list[Any]:
    """The types a field's annotation allows, unions and Annotated unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [member for arg in get_args(annotation) for member in _members(arg)]
    return [annotation]


def _is_model(member: Any) -> bool:
    return isinstance(member, type) and issubclass(member, BaseModel)


def _field_types(classes: Sequence[Any], path: Sequence[str]) -> list[Any]:
    """The types a key's value may take (`path`: its tables, then its field); [] when no class
    has it (pydantic then names the unknown key)."""
    name, rest = path[0], path[1:]
    found = [
        m
        for c in classes
        if name in c.model_fields
        for m in _members(c.model_fields[name].annotation)
    ]
    if not rest:
        return found
    return _field_types([m for m in found if _is_model(m)], rest)


def _is_sequence(member: Any) -> bool:
    return (get_origin(member) or member) in (tuple, list)


def _env_value(key: str, text: str, allowed: Sequence[Any]) -> Any:
    """An environment variable's text as its field takes it: JSON for a list, tuple, table or
    model (`[]`, `{"a": 1}`, `null`), comma-separated items for a list or tuple alone; any
    other text as given (pydantic casts numbers, booleans and paths)."""
    if not any(
        _is_sequence(m) or _is_model(m) or get_origin(m) is dict or m is dict for m in allowed
    ):
        return text
    if text.lstrip()[:1] in ("[", "{") or text.strip() == "null":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{key}: not valid JSON ({exc})") from None
    if all(_is_sequence(m) for m in allowed if m is not type(None)):
        return [item.strip() for item in text.split(",")] if text.strip() else []
    return text


def _name_variables(exc: ValidationError, sources: Mapping[Location, str]) -> SettingsError | None:
    """The errors, each named by the variable that set its value; None if none came from one."""
    lines, named = [], False
    for error in exc.errors():
        where = error["loc"]
        key = next((k for at, k in sources.items() if _within(at, where)), None)
        place = ".".join(map(str, setting_location(where)))
        lines.append(f"{key} ({place}): {error['msg']}" if key else f"{place}: {error['msg']}")
        named |= key is not None
    if not named:
        return None
    return SettingsError("invalid settings:\n  " + "\n  ".join(lines))


def _within(at: Location, where: Location) -> bool:
    """Whether an error's location is the value set at `at` (a discriminated union adds its tag
    to the location: backend.onnxruntime.sessions for backend.sessions)."""
    if where[: len(at[:2])] != at[:2]:
        return False
    rest = iter(where[2:])
    return all(part in rest for part in at[2:])
