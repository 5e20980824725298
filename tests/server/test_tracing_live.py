"""Traces in a real trace server: requests with a known `traceparent` on /predict, the OpenAI
API and KServe v2 (HTTP and gRPC), in one process and across `api_servers = 2`, are read back
from MLflow's tracking server (tests/support/trace_server.py): one trace per request holding its
SERVER span (the caller's span its parent) and its queue span, and the batch's own trace, whose
span links to the request and holds the backend call."""

from __future__ import annotations

import os

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from openai import OpenAI

from ferry.bench.processes import free_port
from ferry.bench.server_process import DEFAULT_MODEL, default_model_config, ferry_server
from tests.support.trace_server import Span, TraceServer, trace_server

# The first test's setup starts the trace server (~30 s of CPU: MLflow's imports, twice) and a
# Ferry: past pytest's default 300 s on a loaded 2-core machine.
pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

PROTOCOLS = ("predict", "openai", "kserve_http", "kserve_grpc")
SERVER_SPANS = {
    "predict": "POST /predict",
    "openai": "POST /v1/embeddings",
    "kserve_http": "POST /v2/models/{name}/infer",
    "kserve_grpc": "inference.GRPCInferenceService/ModelInfer",
}


@pytest.fixture(scope="session")
def traces():
    with trace_server() as server:
        yield server


@pytest.fixture(scope="module", params=[1, 2], ids=["one_process", "api_servers_2"])
def ferry(request, traces: TraceServer):
    grpc_port = free_port()
    server = {
        "grpc_port": grpc_port,
        "api_servers": request.param,
        "otlp_traces_endpoint": traces.otlp_endpoint,
    }
    with ferry_server(
        [default_model_config(batching={"max_queue_delay_s": 0.005})],
        server=server,
        env=traces.exporter_env,
        ready_timeout_s=300,
    ) as handle:
        yield handle, f"127.0.0.1:{grpc_port}"


def _traceparent() -> tuple[str, str, str]:
    """A caller's context: (header, trace id, span id)."""
    trace_id, span_id = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _send(protocol: str, url: str, grpc_address: str, traceparent: str) -> str | None:
    """One request on `protocol` with the caller's `traceparent`; the `traceresponse` it got
    where the client shows response headers (None elsewhere)."""
    headers = {"traceparent": traceparent}
    if protocol == "predict":
        answer = httpx.post(
            f"{url}/predict", json={"inputs": ["Ferry batches requests."]}, headers=headers
        )
        answer.raise_for_status()
        return answer.headers["traceresponse"]
    if protocol == "openai":
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        raw = client.embeddings.with_raw_response.create(
            model=DEFAULT_MODEL, input="Ferry batches requests.", extra_headers=headers
        )
        raw.parse()
        return raw.headers["traceresponse"]
    ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
    module = triton_http if protocol == "kserve_http" else triton_grpc
    inputs = []
    for name, value in (("input_ids", ids), ("attention_mask", np.ones_like(ids))):
        tensor = module.InferInput(name, list(value.shape), "INT64")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    if protocol == "kserve_http":
        http_client = triton_http.InferenceServerClient(url.removeprefix("http://"))
        http_client.infer(DEFAULT_MODEL, inputs, headers=headers)
    else:
        grpc_client = triton_grpc.InferenceServerClient(grpc_address)
        grpc_client.infer(DEFAULT_MODEL, inputs, headers=headers)
    return None


def _named(spans: list[Span], name: str) -> Span:
    (span,) = [s for s in spans if s.name == name]
    return span


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_is_one_trace_linked_to_its_batch(ferry, traces: TraceServer, protocol: str):
    handle, grpc_address = ferry
    traceparent, trace_id, caller_span = _traceparent()
    traceresponse = _send(protocol, handle.url, grpc_address, traceparent)

    request_trace = traces.wait_for_spans(trace_id, SERVER_SPANS[protocol], "ferry.queue")
    assert {s.trace_id for s in request_trace} == {trace_id}
    server = _named(request_trace, SERVER_SPANS[protocol])
    assert server.parent_id == caller_span  # the caller's span is the request's parent
    assert server.attributes["ferry.request_id"]
    if traceresponse is not None:  # the server span's own context, sent back
        assert traceresponse == f"00-{trace_id}-{server.span_id}-01"
    # The wait is the request's (in the engine process too, with api_servers = 2).
    queue = _named(request_trace, "ferry.queue")
    assert queue.parent_id == server.span_id
    (batch_trace, batch_span_id), *_ = queue.links

    batch_spans = traces.wait_for_spans(batch_trace, "ferry.batch", "ferry.backend")
    batch = _named(batch_spans, "ferry.batch")
    assert batch.span_id == batch_span_id
    assert batch.parent_id is None  # a batch belongs to no one request's trace...
    assert (trace_id, server.span_id) in batch.links  # ...it links to each
    assert batch.attributes["ferry.batch.size"] >= 1
    assert batch.attributes["ferry.batch.padded_length"] >= 4
    assert 0.0 <= batch.attributes["ferry.batch.padding_ratio"] < 1.0
    backend = _named(batch_spans, "ferry.backend")
    assert backend.parent_id == batch.span_id
