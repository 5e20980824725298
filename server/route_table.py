"""Every route Ferry serves, declared once: path, methods, class, error dialect, whether it needs
the API key, and the media types its body may have.

The gateway (key, drain, body type, in-flight group), the framework's error handlers (dialect),
the hot routes' registration (`hot.register`) and the gRPC servicer all read this table, and
nothing else says which route is which. tests/server/test_route_table.py checks it against what
the framework mounts and what the servicer implements, so it cannot drift from either.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ferry.server.dialects import ANTHROPIC, FERRY, KSERVE, OPENAI, ErrorDialect


class RouteClass(enum.Enum):
    INFERENCE = "inference"  # the hot routes: the gateway dispatches them itself
    METADATA = "metadata"  # models, KServe server and model metadata, configuration, statistics
    ADMIN = "admin"  # LoRA adapters, shared memory regions, model loads and unloads
    HEALTH = "health"
    METRICS = "metrics"
    DOCS = "docs"


# While draining, new requests of these classes are refused 503 and those accepted are waited
# for; health, metrics and docs keep answering (a probe must see the drain).
DRAINED = frozenset({RouteClass.INFERENCE, RouteClass.METADATA, RouteClass.ADMIN})

JSON = "application/json"  # and any `+json` type
OCTETS = "application/octet-stream"  # KServe's binary tensors (or Triton's header, whatever type)
UNTYPED = ""  # no Content-Type at all: tritonclient.http sends none with JSON-only requests
IMAGES = ("image/jpeg", "image/png")  # an image model's raw body on /predict (image_predict.py)
JSON_BODY = (JSON,)
# Any Content-Type, the body read as JSON: Triton ignores it, and its clients send none
# (tritonclient.http) or libcurl's application/x-www-form-urlencoded (perf_analyzer).
ANY_TYPE: tuple[str, ...] = ()
TENSOR_BODY = (JSON, OCTETS, UNTYPED)
# A JSON body as tritonclient sends it: no type from .http, application/octet-stream from .http.aio
# (aiohttp's type for bytes). Neither is a type a page on another origin posts without a preflight.
TRITONCLIENT_JSON = (JSON, OCTETS, UNTYPED)

GRPC_SERVICE = "/inference.GRPCInferenceService"
GRPC = "GRPC"  # the method of a gRPC route: its calls are named by path alone
UNMATCHED = "other"  # the metrics' label for a request no route claims
# In-flight requests are counted by first path segment before routing (a bounded label set):
# the groups the dashboards watch, every other path is UNMATCHED.
IN_FLIGHT_GROUPS = frozenset({"predict", "v1", "v2", "health", "metrics"})


@dataclass(frozen=True)
class Route:
    # As the framework writes it: `{name}` is one segment, `{name:path}` the rest. gRPC: the
    # call's full method path, which is also its metrics endpoint label.
    path: str
    methods: frozenset[str]
    kind: RouteClass
    dialect: ErrorDialect  # gRPC: the status carries KServe's message (grpc_service.grpc_status)
    # False: open without the key, unless a setting protects its class (health, metrics).
    needs_key: bool = True
    media: tuple[str, ...] = ()  # the body's accepted media types; () for routes without one
    # Answers compressed when the client accepts gzip or deflate (Triton's HTTP compression;
    # request bodies may come compressed to any route: server/content_encoding.py).
    compress: bool = False

    @property
    def drained(self) -> bool:
        return self.kind in DRAINED

    @property
    def grpc(self) -> bool:
        return GRPC in self.methods


def _get(path: str, kind: RouteClass, dialect: ErrorDialect, *, needs_key: bool = True) -> Route:
    return Route(path, frozenset({"GET"}), kind, dialect, needs_key)


def _post(
    path: str,
    kind: RouteClass,
    dialect: ErrorDialect,
    media: tuple[str, ...] = JSON_BODY,
    *,
    compress: bool = False,
) -> Route:
    return Route(path, frozenset({"POST"}), kind, dialect, media=media, compress=compress)


def _settings(path: str) -> Route:
    """KServe settings read (GET) and updated (POST, JSON as tritonclient sends it)."""
    methods = frozenset({"GET", "POST"})
    return Route(path, methods, RouteClass.METADATA, KSERVE, media=TRITONCLIENT_JSON)


def _grpc(method: str, kind: RouteClass, *, needs_key: bool = True) -> Route:
    return Route(f"{GRPC_SERVICE}/{method}", frozenset({GRPC}), kind, KSERVE, needs_key)


INFERENCE, METADATA, ADMIN = RouteClass.INFERENCE, RouteClass.METADATA, RouteClass.ADMIN
HEALTH, METRICS, DOCS = RouteClass.HEALTH, RouteClass.METRICS, RouteClass.DOCS

ROUTES: tuple[Route, ...] = (
    _post("/predict", INFERENCE, FERRY, (JSON, *IMAGES)),
    _post("/v1/embeddings", INFERENCE, OPENAI),
    _post("/rerank", INFERENCE, FERRY),
    _post("/v1/rerank", INFERENCE, OPENAI),
    _post("/score", INFERENCE, FERRY),
    _post("/v1/score", INFERENCE, OPENAI),
    _post("/tokenize", INFERENCE, FERRY),
    _post("/detokenize", INFERENCE, FERRY),
    _post("/v1/chat/completions", INFERENCE, OPENAI),
    _post("/v1/completions", INFERENCE, OPENAI),
    _post("/v1/responses", INFERENCE, OPENAI),
    _post("/v1/messages", INFERENCE, ANTHROPIC),
    _post("/v1/messages/count_tokens", INFERENCE, ANTHROPIC),
    _post("/v2/models/{name}/infer", INFERENCE, KSERVE, TENSOR_BODY, compress=True),
    _post(
        "/v2/models/{name}/versions/{version}/infer",
        INFERENCE,
        KSERVE,
        TENSOR_BODY,
        compress=True,
    ),
    _get("/v1/models", METADATA, OPENAI),
    _get("/v1/models/{model_id:path}", METADATA, OPENAI),
    _get("/v2", METADATA, KSERVE),
    _get("/v2/models/stats", METADATA, KSERVE),
    _get("/v2/models/{name}/stats", METADATA, KSERVE),
    _get("/v2/models/{name}/versions/{version}/stats", METADATA, KSERVE),
    _get("/v2/models/{name}", METADATA, KSERVE),
    _get("/v2/models/{name}/versions/{version}", METADATA, KSERVE),
    _get("/v2/models/{name}/config", METADATA, KSERVE),
    _get("/v2/models/{name}/versions/{version}/config", METADATA, KSERVE),
    # A model's readiness names a model: behind the key, and refused once draining (HTTP, gRPC).
    _get("/v2/models/{name}/ready", METADATA, KSERVE),
    _get("/v2/models/{name}/versions/{version}/ready", METADATA, KSERVE),
    # Triton's shared memory extension: system regions (per tenant), CUDA answered unsupported.
    _get("/v2/systemsharedmemory/status", METADATA, KSERVE),
    _get("/v2/systemsharedmemory/region/{name}/status", METADATA, KSERVE),
    _post("/v2/systemsharedmemory/region/{name}/register", ADMIN, KSERVE, ANY_TYPE),
    _post("/v2/systemsharedmemory/unregister", ADMIN, KSERVE, ANY_TYPE),
    _post("/v2/systemsharedmemory/region/{name}/unregister", ADMIN, KSERVE, ANY_TYPE),
    _get("/v2/cudasharedmemory/status", METADATA, KSERVE),
    _get("/v2/cudasharedmemory/region/{name}/status", METADATA, KSERVE),
    _post("/v2/cudasharedmemory/region/{name}/register", ADMIN, KSERVE, ANY_TYPE),
    _post("/v2/cudasharedmemory/unregister", ADMIN, KSERVE, ANY_TYPE),
    _post("/v2/cudasharedmemory/region/{name}/unregister", ADMIN, KSERVE, ANY_TYPE),
    # Triton's model repository extension (routes/model_repository.py).
    _post("/v2/repository/index", METADATA, KSERVE, TRITONCLIENT_JSON),
    _post("/v2/repository/models/{name}/load", ADMIN, KSERVE, TRITONCLIENT_JSON),
    _post("/v2/repository/models/{name}/unload", ADMIN, KSERVE, TRITONCLIENT_JSON),
    # Trace and log settings: read, and updated only to what Ferry does (kserve/trace_settings).
    _settings("/v2/trace/setting"),
    _settings("/v2/models/{name}/trace/setting"),
    _settings("/v2/logging"),
    _post("/v1/load_lora_adapter", ADMIN, OPENAI),
    _post("/v1/unload_lora_adapter", ADMIN, OPENAI),
    _get("/health", HEALTH, FERRY, needs_key=False),
    _get("/health/live", HEALTH, FERRY, needs_key=False),
    _get("/health/ready", HEALTH, FERRY, needs_key=False),
    _get("/v2/health/live", HEALTH, KSERVE, needs_key=False),
    _get("/v2/health/ready", HEALTH, KSERVE, needs_key=False),
    _get("/metrics", METRICS, FERRY, needs_key=False),
    _get("/openapi.json", DOCS, FERRY, needs_key=False),
    _get("/docs", DOCS, FERRY, needs_key=False),
    _get("/docs/oauth2-redirect", DOCS, FERRY, needs_key=False),
    _get("/redoc", DOCS, FERRY, needs_key=False),
    # The console's page and files (routes/console.py) are open, as the docs are; its reading of
    # the metrics, and every API it calls, need the key.
    _get("/console", DOCS, FERRY, needs_key=False),
    _get("/console/live", METADATA, FERRY),
    _get("/console/{name}", DOCS, FERRY, needs_key=False),
    # KServe v2 over gRPC (kserve/grpc_service.py), through the same key, drain and metrics.
    _grpc("ServerLive", HEALTH, needs_key=False),
    _grpc("ServerReady", HEALTH, needs_key=False),
    _grpc("ModelReady", METADATA),
    _grpc("ServerMetadata", METADATA),
    _grpc("ModelMetadata", METADATA),
    _grpc("ModelConfig", METADATA),
    _grpc("ModelStatistics", METADATA),
    _grpc("ModelInfer", INFERENCE),
    _grpc("ModelStreamInfer", INFERENCE),
    _grpc("SystemSharedMemoryStatus", METADATA),
    _grpc("SystemSharedMemoryRegister", ADMIN),
    _grpc("SystemSharedMemoryUnregister", ADMIN),
    _grpc("CudaSharedMemoryStatus", METADATA),
    _grpc("CudaSharedMemoryRegister", ADMIN),
    _grpc("CudaSharedMemoryUnregister", ADMIN),
    _grpc("RepositoryIndex", METADATA),
    _grpc("RepositoryModelLoad", ADMIN),
    _grpc("RepositoryModelUnload", ADMIN),
)


def first_segment(path: str) -> str:
    return path[1:].partition("/")[0]


def _template_regex(path: str) -> str:
    """A template as a regex without capturing groups: `{x}` one segment, `{x:path}` the rest."""
    parts = re.split(r"(\{\w+(?::path)?\})", path)
    return "".join(
        ("(?:.+)" if p.endswith(":path}") else "(?:[^/]+)") if p.startswith("{") else re.escape(p)
        for p in parts
    )


class RouteTable:
    """A path's route: one dict look-up for fixed paths, one compiled alternation for templates
    (a template string such as `/v2/models/{name}/infer` finds its own route too)."""

    def __init__(self, routes: Iterable[Route], default: ErrorDialect = FERRY) -> None:
        self.routes = tuple(routes)
        paths = [r.path for r in self.routes]
        if len(set(paths)) != len(paths):
            raise ValueError("a path is declared twice in the route table")
        self._fixed = {r.path: r for r in self.routes if "{" not in r.path}
        self._templates = [r for r in self.routes if "{" in r.path]
        alternatives = (
            f"(?P<r{i}>{_template_regex(r.path)})" for i, r in enumerate(self._templates)
        )
        self._matcher = re.compile("|".join(alternatives) or "(?!)")
        self._default = default
        # A path no route claims (a 404, a 401 before routing) is answered in the dialect most
        # declared routes under its first segment speak: /v1/... OpenAI's (Anthropic's two
        # routes there are the few), /v2/... KServe's; a tie is the default's.
        by_segment: dict[str, Counter[ErrorDialect]] = {}
        for route in self.routes:
            by_segment.setdefault(first_segment(route.path), Counter())[route.dialect] += 1
        self._families = {}
        for segment, counts in by_segment.items():
            ranked = counts.most_common(2)
            if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
                self._families[segment] = ranked[0][0]

    def find(self, path: str) -> Route | None:
        route = self._fixed.get(path)
        if route is None:
            found = self._matcher.fullmatch(path)
            if found is not None and found.lastgroup is not None:
                route = self._templates[int(found.lastgroup[1:])]
        return route

    def dialect_of(self, path: str) -> ErrorDialect:
        route = self.find(path)
        if route is not None:
            return route.dialect
        return self._families.get(first_segment(path), self._default)


HTTP_ROUTES = RouteTable(r for r in ROUTES if not r.grpc)
# The servicer's calls by method name.
GRPC_ROUTES: Mapping[str, Route] = MappingProxyType(
    {r.path.rpartition("/")[2]: r for r in ROUTES if r.grpc}
)


def in_flight_group(path: str) -> str:
    head = first_segment(path)
    return head if head in IN_FLIGHT_GROUPS else UNMATCHED
