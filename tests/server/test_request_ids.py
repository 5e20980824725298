"""Request ids on the real server process: the client's `x-request-id` is echoed when it is safe,
else one is made; every answer says it (refusals too); with `log_format = "json"` the log is JSON
lines and a warning about a request carries that request's id, in one process and in front of an
engine process (`api_servers = 2`). gRPC returns the id in the trailing metadata."""

from __future__ import annotations

import json
import re

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.bench.processes import free_port
from ferry.bench.server_process import DEFAULT_MODEL_DIR, FerryProcess, ferry_server
from ferry.server import request_ids
from tests.server import faulty_model

pytestmark = pytest.mark.integration

NAME = "faulty"
MAX_BODY_BYTES = 4096
MADE = re.compile(r"[0-9a-f]{32}")  # what the server makes: 16 random bytes as hex
POISON = 500  # a token id past the faulty model's table: ONNX Runtime fails on it (a 500)


def _model(folder) -> dict[str, object]:
    return {
        "name": NAME,
        "path": str(folder),
        "backend": {"kind": "onnxruntime", "sessions": 1},
        "batching": {"max_queue_delay_s": 0.001},
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return faulty_model.build(
        tmp_path_factory.mktemp("faulty") / NAME, DEFAULT_MODEL_DIR / "tokenizer.json"
    )


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(folder, grpc_port):
    server = {
        "log_format": "json",
        "access_log": True,
        "max_body_bytes": MAX_BODY_BYTES,
        "grpc_port": grpc_port,
    }
    with ferry_server([_model(folder)], server=server, log_level="info") as handle:
        yield handle


def _predict(server: FerryProcess, ids: object, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/predict",
        json={"model": NAME, "input_ids": ids},
        headers={k.replace("_", "-"): v for k, v in headers.items()},
        timeout=30,
    )


def _log_lines(server: FerryProcess) -> list[dict[str, object]]:
    """The log's lines: every one is JSON but ONNX Runtime's, which its C++ logger writes to
    stderr itself (Python's logging never sees them)."""
    lines = [line for line in server.log_path.read_text().splitlines() if line.strip()]
    native = [line for line in lines if not line.startswith("{")]
    assert all("onnxruntime" in line for line in native), native
    return [json.loads(line) for line in lines if line.startswith("{")]


# Requests and their statuses: the hot route's answer (200), its refusals (422, 404 for an
# unknown model), the framework's routing (404 for an unknown path) and the gateway's (413).
REQUESTS = {
    "ok": (200, "POST", "/predict", {"json": {"model": NAME, "input_ids": [1, 2, 3]}}),
    "invalid": (422, "POST", "/predict", {"json": {"model": NAME, "input_ids": "not ids"}}),
    "unknown model": (404, "POST", "/predict", {"json": {"model": "nobody", "input_ids": [1]}}),
    "unknown path": (404, "GET", "/no/such/path", {}),
    "too large": (413, "POST", "/predict", {"content": b"[" + b"1," * MAX_BODY_BYTES + b"1]"}),
}


def _send(server: FerryProcess, name: str, headers: dict[str, str]) -> httpx.Response:
    status, method, path, kwargs = REQUESTS[name]
    if "content" in kwargs:
        headers = {**headers, "content-type": "application/json"}
    response = httpx.request(method, server.url + path, headers=headers, timeout=30, **kwargs)
    assert response.status_code == status, response.text
    return response


@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_sent_id_is_echoed_and_one_is_made_when_none_is_sent(server, name):
    sent = _send(server, name, {"x-request-id": f"client-{name.replace(' ', '-')}"})
    assert sent.headers["x-request-id"] == f"client-{name.replace(' ', '-')}"
    made = _send(server, name, {})
    assert MADE.fullmatch(made.headers["x-request-id"])
    again = _send(server, name, {})
    assert again.headers["x-request-id"] != made.headers["x-request-id"]


@pytest.mark.parametrize(
    "unsafe",
    [
        "a" * (request_ids.MAX_LENGTH + 1),
        "two words",
        'quoted"id',
        "tab\there",
        "semi;colon",
        "caf\xe9".encode("latin-1"),
    ],
)
def test_an_unsafe_id_is_replaced(server, unsafe):
    response = httpx.post(
        f"{server.url}/predict",
        json={"model": NAME, "input_ids": [1]},
        headers={"x-request-id": unsafe},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert MADE.fullmatch(response.headers["x-request-id"])


def test_the_longest_safe_id_is_kept(server):
    longest = "id-" + "7" * (request_ids.MAX_LENGTH - 3)
    response = _predict(server, [1], x_request_id=longest)
    assert response.headers["x-request-id"] == longest


def test_ids_that_cannot_cross_http_are_refused_too():
    # A newline or a control character never reaches the gateway over HTTP/1.1 (the header
    # ends there, or the parser refuses it); the rule refuses them all the same.
    for unsafe in (b"a\nb", b"a\r\nx-evil: 1", b"\x1b[31m", b"a\x00b"):
        assert MADE.fullmatch(request_ids.from_client(unsafe).decode())
    assert request_ids.from_client(b"3f1c-09:ab/cd+ef=") == b"3f1c-09:ab/cd+ef="


def test_the_log_is_json_lines_and_a_warning_about_a_request_carries_its_id(server):
    failed = _predict(server, [1, POISON], x_request_id="poisoned-1")
    assert failed.status_code == 500, failed.text
    assert failed.headers["x-request-id"] == "poisoned-1"
    lines = _log_lines(server)
    for line in lines:
        assert {"time", "level", "logger", "message"} <= line.keys(), line
    warned = [
        line
        for line in lines
        if line.get("request_id") == "poisoned-1" and line["level"] == "WARNING"
    ]
    assert warned, lines[-10:]
    assert warned[0]["logger"] == "ferry.server.errors"
    assert "/predict answered 500" in str(warned[0]["message"])
    # The access log (uvicorn's) carries it as well.
    access = [
        line
        for line in lines
        if line["logger"] == "uvicorn.access" and line.get("request_id") == "poisoned-1"
    ]
    assert access and " 500" in str(access[0]["message"])
    # Lines about no request have none.
    assert any("request_id" not in line for line in lines)


def test_grpc_returns_the_id_in_the_trailing_metadata(server, grpc_port):
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ServerLive.with_call(
            service_pb2.ServerLiveRequest(), metadata=(("x-request-id", "grpc-1"),)
        )
        assert ("x-request-id", "grpc-1") in call.trailing_metadata()
        _, call = stub.ServerLive.with_call(service_pb2.ServerLiveRequest())
        made = dict(call.trailing_metadata())["x-request-id"]
        assert MADE.fullmatch(made)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(
                service_pb2.ModelInferRequest(model_name="nobody"),
                metadata=(("x-request-id", "grpc-2"),),
            )
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert ("x-request-id", "grpc-2") in refused.value.trailing_metadata()


def test_in_front_of_an_engine_process_too(folder):
    server = {"log_format": "json", "api_servers": 2, "max_body_bytes": MAX_BODY_BYTES}
    with ferry_server([_model(folder)], server=server) as handle:
        ok = _predict(handle, [1, 2], x_request_id="two-api-ok")
        assert ok.status_code == 200, ok.text
        assert ok.headers["x-request-id"] == "two-api-ok"
        assert MADE.fullmatch(_predict(handle, [1]).headers["x-request-id"])
        failed = _predict(handle, [POISON], x_request_id="two-api-poisoned")
        assert failed.status_code == 500, failed.text
        assert failed.headers["x-request-id"] == "two-api-poisoned"
        lines = _log_lines(handle)
    warned = [line for line in lines if line.get("request_id") == "two-api-poisoned"]
    assert warned and warned[0]["level"] == "WARNING", lines[-10:]
    assert "/predict answered 500" in str(warned[0]["message"])
