"""Triton's model repository extension on a real server, in both layouts (one process; API
processes in front of an engine process): index, load (with a config override) and unload over
HTTP and gRPC, for a plain ONNX graph, the token encoder and an LLM.

A load runs beside other models' requests (counted, not timed), an unload waits for the
requests in flight, and an unloaded model's metrics series go with it."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ferry.bench.processes import free_port
from ferry.bench.server_process import (
    DEFAULT_MODEL,
    default_model_config,
    ferry_server,
    write_config,
)
from tests.server.conftest import API_SERVERS
from tests.support.llm_configs import tiny_llm_config
from tests.support.plain_graphs import masked_mean
from tests.support.server_processes import READY_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration

GRAPH, ENCODER, LLM = "mm", DEFAULT_MODEL, "tiny-llm"
REPO = "/v2/repository"


@pytest.fixture(scope="module", params=API_SERVERS)
def server(request, tmp_path_factory):
    """Explicit model control: only the plain graph served at start."""
    graph = masked_mean(tmp_path_factory.mktemp("graphs") / "mm.onnx")
    grpc_port = free_port()
    with ferry_server(
        [
            # Small batches: calibrating at load is quick.
            default_model_config(backend={"sessions": 1}, batching={"max_batch_size": 4}),
            {"name": GRAPH, "path": str(graph)},
        ],
        server={
            "grpc_port": grpc_port,
            "api_servers": request.param,
            "model_control_mode": "explicit",
            "load_models": [GRAPH],
        },
        llm_models=[tiny_llm_config()],
        ready_timeout_s=READY_TIMEOUT_S,
    ) as handle:
        handle.grpc_address = f"127.0.0.1:{grpc_port}"
        handle.http = httpx.Client(base_url=handle.url, timeout=120)
        yield handle
        handle.http.close()


def load(server, name: str, **parameters: object) -> httpx.Response:
    body = {"parameters": parameters} if parameters else {}
    return server.http.post(f"{REPO}/models/{name}/load", json=body)


def unload(server, name: str) -> httpx.Response:
    return server.http.post(f"{REPO}/models/{name}/unload")


def index(server, **body: object) -> dict[str, dict[str, str]]:
    answer = server.http.post(f"{REPO}/index", json=body)
    assert answer.status_code == 200, answer.text
    return {entry["name"]: entry for entry in answer.json()}


def graph_request(server) -> int:
    return infer(server.http, GRAPH)


def infer(http: httpx.Client, graph: str) -> int:
    """A masked_mean graph's request: its status."""
    body = {
        "inputs": [
            {"name": "data", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
            {"name": "mask", "datatype": "INT64", "shape": [1, 3], "data": [1, 1, 0]},
        ]
    }
    return http.post(f"/v2/models/{graph}/infer", json=body).status_code


def use(server, name: str) -> httpx.Response:
    """One request for `name` on its own route."""
    if name == LLM:
        body = {"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        return server.http.post("/v1/chat/completions", json=body)
    return server.http.post("/predict", json={"model": name, "inputs": ["a short text"]})


def series(server, name: str) -> list[str]:
    return [line for line in server.metrics().splitlines() if f'model="{name}"' in line]


def test_index_lists_every_model_with_its_state(server):
    assert unload(server, LLM).status_code == 200
    listed = index(server)
    assert listed[GRAPH] == {"name": GRAPH, "version": "1", "state": "READY"}
    assert set(listed) == {GRAPH, ENCODER, LLM}
    assert listed[LLM]["state"] == "UNAVAILABLE"
    assert set(index(server, ready=True)) == {GRAPH}
    refused = server.http.post(f"{REPO}/index", json={"ready": "yes"})
    assert refused.status_code == 400 and "ready" in refused.json()["error"]


@pytest.mark.parametrize("name", [ENCODER, LLM])
def test_load_runs_beside_other_models_and_unload_takes_the_series(server, name):
    """While `name` loads, the plain graph keeps answering: its requests are counted until
    the load is answered (a load that held the event loop would let one or two through)."""
    unload(server, name)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load, server, name)
        answered = 0
        while not loading.done():
            assert graph_request(server) == 200
            answered += 1
        assert loading.result().status_code == 200, loading.result().text
    assert answered >= 5, f"{answered} requests answered while {name} loaded"
    assert index(server)[name]["state"] == "READY"
    assert use(server, name).status_code == 200
    assert series(server, name)
    assert unload(server, name).status_code == 200
    assert use(server, name).status_code == 404
    assert series(server, name) == []
    assert index(server)[name] == {
        "name": name,
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }


def test_unload_waits_for_the_requests_in_flight(server):
    """A generation streaming when its LLM is unloaded runs to its end; the unload is
    answered after it, and the next request is a 404."""
    assert load(server, LLM).status_code == 200
    events: list[str] = []
    body = {
        "model": LLM,
        "messages": [{"role": "user", "content": "tell a long story"}],
        "max_tokens": 200,
        "stream": True,
    }
    with server.http.stream("POST", "/v1/chat/completions", json=body) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert "error" not in first
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            unloading = pool.submit(lambda: (unload(server, LLM), events.append("unloaded"))[0])
            rest = [line for line in lines if line.startswith("data: ")]
            events.append("stream ended")
            assert unloading.result().status_code == 200
    chunks = [json.loads(line[6:]) for line in rest if line != "data: [DONE]"]
    assert rest[-1] == "data: [DONE]"
    assert not any("error" in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    assert events == ["stream ended", "unloaded"]
    assert use(server, LLM).status_code == 404


def test_config_override_maps_triton_fields_and_does_not_stick(server):
    override = {"max_batch_size": "4", "dynamic_batching": {"max_queue_delay_microseconds": 500}}
    assert load(server, GRAPH, config=json.dumps(override)).status_code == 200
    config = server.http.get(f"/v2/models/{GRAPH}/config").json()
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert graph_request(server) == 200
    assert load(server, GRAPH, config=json.dumps({"batching": {"max_batch_size": 2}})).is_success
    assert server.http.get(f"/v2/models/{GRAPH}/config").json()["max_batch_size"] == 2
    assert load(server, GRAPH).status_code == 200  # the repository's entry again
    assert server.http.get(f"/v2/models/{GRAPH}/config").json()["max_batch_size"] == 32


@pytest.mark.parametrize(
    ("path", "body", "status", "named"),
    [
        (f"{REPO}/models/nope/load", {}, 404, "failed to load 'nope'"),
        (f"{REPO}/models/nope/unload", {}, 404, "failed to unload 'nope'"),
        (f"{REPO}/models/mm/load", {"parameters": {"config": "{{"}}, 400, "parameters.config"),
        (f"{REPO}/models/mm/load", {"parameters": {"config": '{"input": []}'}}, 400, "input"),
        (f"{REPO}/models/mm/load", {"parameters": {"config": '{"path": "/"}'}}, 400, "path"),
        (
            f"{REPO}/models/mm/load",
            {"parameters": {"config": '{"max_batch_size": 0}'}},
            400,
            "max_batch_size",
        ),
        (
            f"{REPO}/models/mm/load",
            {"parameters": {"config": "{}", "file:1/model.onnx": "AAAA"}},
            400,
            "file:1/model.onnx",
        ),
        (f"{REPO}/models/mm/load", {"parameters": {"warmup": True}}, 400, "warmup"),
        (f"{REPO}/models/mm/unload", {"parameters": {"unload_dependents": 1}}, 400, "dependents"),
        (f"{REPO}/models/mm/load", {"config": "{}"}, 400, "config"),
    ],
)
def test_refusals_name_the_field(server, path, body, status, named):
    answer = server.http.post(path, json=body)
    assert answer.status_code == status, answer.text
    assert named in answer.json()["error"]
    assert graph_request(server) == 200  # nothing was unloaded on the way


def test_grpc_index_load_unload_of_an_llm(server):
    client = grpcclient.InferenceServerClient(server.grpc_address)
    client.unload_model(LLM)
    assert not client.is_model_ready(LLM)
    client.load_model(LLM, config=json.dumps({"max_running": 2}))
    assert client.is_model_ready(LLM)
    states = {m.name: m.state for m in client.get_model_repository_index().models}
    assert states[LLM] == "READY"
    assert use(server, LLM).status_code == 200
    client.unload_model(LLM, unload_dependents=True)
    assert not client.is_model_ready(LLM)
    assert set(index(server, ready=True)) == {GRAPH}
    with pytest.raises(InferenceServerException, match="max_running") as refused:
        client.load_model(LLM, config=json.dumps({"max_running": 0}))
    assert refused.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert not client.is_model_ready(LLM)


def test_metadata_lists_the_extension(server):
    assert "model_repository" in server.http.get("/v2").json()["extensions"]


def test_none_mode_refuses_load_and_unload(kserve):
    """The default mode serves its models from start to end, in Triton's words."""
    answer = httpx.post(f"{kserve.url}{REPO}/models/{ENCODER}/unload", timeout=30)
    assert answer.status_code == 403
    assert "explicit model load / unload is not allowed" in answer.json()["error"]
    client = grpcclient.InferenceServerClient(kserve.grpc_url)
    with pytest.raises(InferenceServerException, match="not allowed") as refused:
        client.load_model(ENCODER)
    assert refused.value.status() == str(grpc.StatusCode.PERMISSION_DENIED)
    index = httpx.post(f"{kserve.url}{REPO}/index", timeout=30).json()
    assert index == [{"name": ENCODER, "version": "1", "state": "READY"}]
    assert np.all([client.is_model_ready(ENCODER)])


@pytest.mark.parametrize("api_servers", [1, 2])
def test_poll_mode_follows_the_config_file(tmp_path, api_servers):
    """Poll model control: a model added to the file is loaded, one removed is unloaded (its
    series gone), and load requests are refused, as Triton's --model-control-mode=poll."""
    first, second = masked_mean(tmp_path / "a.onnx"), masked_mean(tmp_path / "b.onnx")
    server_table = {"api_servers": api_servers, "model_control_mode": "poll"}
    server_table["repository_poll_secs"] = 0.2
    with ferry_server(
        [{"name": "a", "path": str(first)}],
        server=server_table,
        ready_timeout_s=READY_TIMEOUT_S,
    ) as server:
        config = Path(server.command[server.command.index("--config") + 1])
        http = httpx.Client(base_url=server.url, timeout=30)
        assert infer(http, "a") == 200
        refused = http.post(f"{REPO}/models/a/load")
        assert refused.status_code == 403 and "not allowed" in refused.json()["error"]
        write_config(config, [{"name": "b", "path": str(second)}], server_table)
        wait_until(lambda: infer(http, "b") == 200, what="b loaded")
        wait_until(lambda: infer(http, "a") == 404, what="a unloaded")
        assert [e["name"] for e in http.post(f"{REPO}/index").json()] == ["b"]
        assert series(server, "a") == []
        http.close()
