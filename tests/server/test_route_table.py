"""The route table against what is really served: every route the framework mounts and every
call the gRPC servicer implements is declared, and nothing else; each declaration is honoured
(the key, the drain) by the real app over HTTP and over gRPC."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import grpc
import pytest
from fastapi.routing import iter_route_contexts
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.bench.processes import free_port
from ferry.server.app import create_app
from ferry.server.dialects import FERRY, KSERVE, OPENAI
from ferry.server.kserve.grpc_service import InferenceServicer
from ferry.server.route_table import (
    GRPC_ROUTES,
    HTTP_ROUTES,
    ROUTES,
    Route,
    RouteClass,
    in_flight_group,
)
from ferry.server.services import app_services
from ferry.server.settings import Settings
from tests.server.inprocess import serving_app

pytestmark = pytest.mark.unit

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
# Written out here, not read from the table: the routes open without the key and answering
# while draining (health, metrics, docs). Anything else the table calls open fails below.
OPEN_HTTP = {
    "/health",
    "/health/live",
    "/health/ready",
    "/v2/health/live",
    "/v2/health/ready",
    "/metrics",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/console",
    "/console/{name}",
}
OPEN_GRPC = {"ServerLive", "ServerReady"}


def mounted() -> set[tuple[str, str]]:
    """(path, method) of every route the framework serves (HEAD is answered as GET)."""
    app = create_app(Settings())
    return {
        (route.path, method)
        for route in iter_route_contexts(app.routes)
        for method in route.methods or ()
        if route.path is not None and method != "HEAD"
    }


def test_the_table_declares_every_route_the_framework_mounts_and_no_other():
    declared = {(r.path, m) for r in HTTP_ROUTES.routes for m in r.methods}
    assert declared == mounted()


def test_the_hot_routes_are_the_declared_inference_routes():
    hot = create_app(Settings()).hot
    for route in HTTP_ROUTES.routes:
        for method in route.methods:
            matched = hot.match(method, route.path)  # a template matches its own pattern
            is_hot = matched is not None and matched[0].template == route.path
            assert is_hot == (route.kind is RouteClass.INFERENCE), route.path
            if is_hot:
                assert matched[0].dialect is route.dialect


def test_every_call_the_grpc_servicer_implements_is_declared_and_no_other():
    implemented = {name for name in vars(InferenceServicer) if name[0].isupper()}
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert implemented <= set(service.methods_by_name)  # the proto's calls, none invented
    assert set(GRPC_ROUTES) == implemented


def test_only_health_metrics_and_docs_are_open():
    assert {r.path for r in HTTP_ROUTES.routes if not r.needs_key} == OPEN_HTTP
    assert {name for name, r in GRPC_ROUTES.items() if not r.needs_key} == OPEN_GRPC
    for route in ROUTES:
        open_ = route.kind in (RouteClass.HEALTH, RouteClass.METRICS, RouteClass.DOCS)
        assert open_ != route.needs_key and open_ != route.drained, route.path


@pytest.mark.parametrize(
    ("path", "declared"),
    [
        ("/v2/models/stats", "/v2/models/stats"),  # the fixed path, not the {name} template
        ("/v2/models/m", "/v2/models/{name}"),
        ("/v2/models/m/versions/1/infer", "/v2/models/{name}/versions/{version}/infer"),
        ("/v2/models/{name}/infer", "/v2/models/{name}/infer"),  # a template finds itself
        ("/v1/models/org/model", "/v1/models/{model_id:path}"),  # :path takes the slashes
        ("/v2/models/a/b/infer", None),  # a {name} is one segment
        ("/v1/models/", None),
        ("/predict/", None),
    ],
)
def test_a_path_finds_its_one_route(path, declared):
    route = HTTP_ROUTES.find(path)
    assert (route.path if route is not None else None) == declared


def test_a_path_no_route_claims_takes_the_dialect_its_family_shares():
    dialect_of = HTTP_ROUTES.dialect_of
    assert dialect_of("/v2") is KSERVE and dialect_of("/v2/repository/index") is KSERVE
    assert dialect_of("/v1/nope") is OPENAI and dialect_of("/v1") is OPENAI
    assert dialect_of("/v2x/models") is FERRY and dialect_of("/nope") is FERRY
    assert dialect_of("/score") is FERRY and dialect_of("/v1/score") is OPENAI


@pytest.mark.parametrize(
    ("path", "group"),
    [("/predict", "predict"), ("/v1/embeddings", "v1"), ("/rerank", "other"), ("/", "other")],
)
def test_in_flight_requests_are_grouped_by_first_segment(path, group):
    assert in_flight_group(path) == group


def concrete(route: Route) -> str:
    return re.sub(r"\{\w+(:path)?\}", "m", route.path)


@pytest.fixture
async def served() -> AsyncIterator[tuple[object, object, str]]:
    """The real app with a key, over httpx's ASGI transport, and its gRPC port."""
    port = free_port()
    settings = Settings(api_key=KEY, grpc_port=port, host="127.0.0.1")
    async with serving_app(settings) as (app, http):
        yield app, http, f"127.0.0.1:{port}"


async def answers(http, route: Route, headers: dict[str, str]):
    """The route's answer to each of its methods (settings routes read and update)."""
    return [
        await http.request(method, concrete(route), content=b"{}", headers=headers)
        for method in sorted(route.methods)
    ]


async def call(target: str, name: str, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            if name == "ModelStreamInfer":  # a stream: its status comes once it is read
                stream = stub.ModelStreamInfer(iter(()), metadata=metadata, timeout=30)
                async for _ in stream:
                    pass
            else:
                request = getattr(service_pb2, f"{name}Request")()
                await getattr(stub, name)(request, metadata=metadata, timeout=30)
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK


async def test_every_route_asks_the_key_unless_open_and_refuses_work_while_draining(served):
    app, http, target = served
    for route in HTTP_ROUTES.routes:
        for response in await answers(http, route, {"Content-Type": "application/json"}):
            assert (response.status_code == 401) == (route.path not in OPEN_HTTP), route.path
    for name in GRPC_ROUTES:
        code = await call(target, name, ())
        assert (code == grpc.StatusCode.UNAUTHENTICATED) == (name not in OPEN_GRPC), name
    app_services(app).drain.begin()
    for route in HTTP_ROUTES.routes:
        for response in await answers(http, route, AUTH):
            refused = response.status_code == 503 and "shutting down" in response.text
            assert refused == (route.path not in OPEN_HTTP), route.path
    for name in GRPC_ROUTES:
        code = await call(target, name, (("authorization", f"Bearer {KEY}"),))
        assert (code == grpc.StatusCode.UNAVAILABLE) == (name not in OPEN_GRPC), name


@pytest.mark.parametrize("method", sorted(GRPC_ROUTES))
def test_every_declared_grpc_call_is_a_method_of_the_servicer(method):
    # A method that ends up outside the class (a merge once put three extensions' methods after
    # a module-level function) leaves the generated base's, answered UNIMPLEMENTED at runtime.
    base = service_pb2_grpc.GRPCInferenceServiceServicer
    assert getattr(InferenceServicer, method) is not getattr(base, method)


async def test_a_method_no_route_serves_gets_405_naming_every_method_the_path_has(served):
    # Where a GET and a POST are two routes, the framework's 405 named the first one's alone.
    _, http, _ = served
    for route in HTTP_ROUTES.routes:
        response = await http.request("OPTIONS", concrete(route), headers=AUTH)
        assert response.status_code == 405, route.path
        allowed = set(response.headers["allow"].split(", ")) - {"HEAD"}
        assert allowed == route.methods, route.path
