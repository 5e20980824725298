"""The hot routes' table, body reader and per-request call, without a server."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from ferry.server.dialects import FERRY, KSERVE
from ferry.server.disconnect import DISCONNECTED
from ferry.server.errors import BodyTooLarge
from ferry.server.hot import ClientGone, HotCall, HotRoutes, read_body, register
from ferry.server.replies import Reply

pytestmark = pytest.mark.unit


async def answer(call: HotCall) -> Reply:
    return Reply(200, call.body)


@pytest.fixture
def routes() -> HotRoutes:
    routes = HotRoutes()
    routes.add("POST", "/predict", answer, FERRY)
    routes.add("POST", "/v2/models/{name}/infer", answer, KSERVE)
    routes.add("POST", "/v2/models/{name}/versions/{version}/infer", answer, KSERVE)
    return routes


def test_an_exact_route_matches_its_method_and_path_only(routes):
    route, params = routes.match("POST", "/predict")
    assert (route.template, route.dialect, dict(params)) == ("/predict", FERRY, {})
    assert routes.match("GET", "/predict") is None
    assert routes.match("POST", "/predict/") is None


def test_a_template_route_hands_over_its_path_parameters(routes):
    route, params = routes.match("POST", "/v2/models/my-model/versions/3/infer")
    assert route.template == "/v2/models/{name}/versions/{version}/infer"
    assert dict(params) == {"name": "my-model", "version": "3"}
    # A parameter is one path segment: a slash in it is another route, here none.
    assert routes.match("POST", "/v2/models/a/b/infer") is None
    assert routes.match("GET", "/v2/models/m/infer") is None


def receiving(*messages: dict):
    queue = list(messages)

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()  # nothing more arrives
        return {}

    return receive


def chunk(body: bytes, more: bool) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


async def test_a_chunked_body_is_read_whole():
    receive = receiving(chunk(b'{"a":', True), chunk(b"", True), chunk(b" 1}", False))
    assert await read_body(receive, 100) == b'{"a": 1}'


async def test_a_body_is_refused_as_soon_as_its_chunks_pass_the_limit():
    receive = receiving(chunk(b"x" * 60, True), chunk(b"x" * 60, True))  # never ends
    with pytest.raises(BodyTooLarge):
        await read_body(receive, 100)


async def test_a_client_gone_mid_body_is_reported():
    with pytest.raises(ClientGone):
        await read_body(receiving(chunk(b"x", True), {"type": "http.disconnect"}), 100)


def call_for(scope: dict, receive) -> HotCall:
    return HotCall(None, "/predict", b"", scope, receive, {}, {})


async def test_the_protocols_disconnect_future_is_used_as_is():
    gone = asyncio.get_running_loop().create_future()
    call = call_for({"headers": [], "extensions": {DISCONNECTED: gone}}, receiving())
    assert call.disconnected() is gone and call.disconnected() is gone
    call.close()
    assert not gone.cancelled()  # the protocol's, not the call's to cancel


async def test_without_the_protocol_one_watcher_listens_for_the_disconnect():
    disconnect = asyncio.Event()

    async def receive() -> dict:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    call = call_for({"headers": []}, receive)
    gone = call.disconnected()
    assert call.disconnected() is gone and not gone.done()
    disconnect.set()
    await asyncio.wait_for(gone, 5)


async def test_closing_the_call_stops_its_watcher():
    call = call_for({"headers": []}, receiving())
    gone = call.disconnected()
    call.close()
    await asyncio.gather(gone, return_exceptions=True)
    assert gone.cancelled()


def test_a_header_is_found_by_its_lowercase_name():
    call = call_for({"headers": [(b"content-type", b"a"), (b"x-id", b"7")]}, receiving())
    assert call.header(b"x-id") == b"7" and call.header(b"x-missing") is None


class Body(BaseModel):
    text: str


INFER = "/v2/models/{name}/infer"


def test_registering_documents_the_body_and_path_parameters_and_only_documents():
    app, routes = FastAPI(), HotRoutes()
    register(app.router, routes, INFER, answer, summary="Run", responses={})
    register(app.router, routes, "/predict", answer, summary="Echo", responses={}, body_model=Body)
    paths = app.openapi()["paths"]
    assert [p["name"] for p in paths[INFER]["post"]["parameters"]] == ["name"]
    body = paths["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/Body"}
    route = routes.match("POST", "/predict")[0]
    # The dialect is the one the route table declares for the path.
    assert route.handler is answer and route.dialect is FERRY
    assert routes.match("POST", "/v2/models/m/infer")[0].dialect is KSERVE
    documented = next(r for r in app.routes if getattr(r, "path", "") == "/predict")
    with pytest.raises(AssertionError, match="served by the gateway"):
        asyncio.run(documented.endpoint(body=Body(text="x")))


@pytest.mark.parametrize("path", ["/echo", "/v1/models", "/v2/models/{name}"])
def test_only_a_declared_inference_route_can_be_registered_hot(path):
    with pytest.raises(ValueError, match="not declared an inference route"):
        register(FastAPI().router, HotRoutes(), path, answer, summary="X", responses={})
