"""KServe v2 gRPC on Ferry, driven by tritonclient.grpc and .grpc.aio as they drive Triton."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.grpc.aio as triton_grpc_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

import ferry
from ferry.bench.processes import free_port
from ferry.bench.server_process import DEFAULT_MODEL, ferry_server
from tests.server.kserve_support import padded_batch
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture
def client(kserve):
    client = triton_grpc.InferenceServerClient(kserve.grpc_url)
    yield client
    client.close()


def token_inputs(module, ids: np.ndarray, mask: np.ndarray) -> list:
    inputs = []
    for name, value in (("input_ids", ids), ("attention_mask", mask)):
        tensor = module.InferInput(name, list(value.shape), "INT64")
        tensor.set_data_from_numpy(value)  # raw_input_contents, tritonclient's default
        inputs.append(tensor)
    return inputs


def test_health_metadata_and_config(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(DEFAULT_MODEL)
    server = client.get_server_metadata(as_json=True)
    assert "statistics" in server["extensions"] and server["version"] == ferry.__version__
    metadata = client.get_model_metadata(DEFAULT_MODEL, as_json=True)
    assert {i["name"] for i in metadata["inputs"]} == {"input_ids", "attention_mask", "text"}
    config = client.get_model_config(DEFAULT_MODEL, as_json=True)["config"]
    assert config["max_batch_size"] == 32
    # protobuf's JSON prints uint64 as strings
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "5000"
    assert {i["name"] for i in config["input"]} == {"input_ids", "attention_mask", "text"}


def test_rows_equal_each_row_run_alone_and_are_counted_in_the_metrics(kserve, client, embed_alone):
    before = metric_value(kserve.metrics(), "ferry_requests_total", endpoint=GRPC_INFER)
    ids, mask = padded_batch([7, 25, 3])
    outputs = [
        triton_grpc.InferRequestedOutput(n) for n in ("sentence_embedding", "last_hidden_state")
    ]
    result = client.infer(DEFAULT_MODEL, token_inputs(triton_grpc, ids, mask), outputs=outputs)
    embeddings = result.as_numpy("sentence_embedding")
    assert embeddings.dtype == np.float32 and embeddings.shape == (3, 384)
    for row in range(3):
        alone = embed_alone(ids[row, : int(mask[row].sum())].tolist())
        assert np.max(np.abs(embeddings[row] - alone)) <= 1e-5
    hidden = result.as_numpy("last_hidden_state")
    assert hidden.shape == (3, 25, 384) and not hidden[2, 3:].any()
    text = kserve.metrics()
    after = metric_value(text, "ferry_requests_total", endpoint=GRPC_INFER, model=DEFAULT_MODEL)
    assert after == before + 1


def test_text_contents_equal_predict(kserve, client):
    texts = ["ferries cross rivers", "a batch of one"]
    tensor = triton_grpc.InferInput("text", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    embeddings = client.infer(DEFAULT_MODEL, [tensor]).as_numpy("sentence_embedding")
    predicted = httpx.post(f"{kserve.url}/predict", json={"inputs": texts}, timeout=30).json()
    expected = np.array([o["sentence_embedding"] for o in predicted["outputs"]])
    assert np.max(np.abs(embeddings - expected)) <= 1e-5


def test_statistics_agree_with_http(kserve, client):
    grpc_stats = client.get_inference_statistics(DEFAULT_MODEL, as_json=True)["model_stats"][0]
    http_stats = httpx.get(f"{kserve.url}/v2/models/{DEFAULT_MODEL}/stats", timeout=10).json()
    # Scraped one after the other with no inference between: the same counts.
    assert int(grpc_stats["execution_count"]) == http_stats["model_stats"][0]["execution_count"]
    queue = http_stats["model_stats"][0]["inference_stats"]["queue"]["count"]
    assert int(grpc_stats["inference_stats"]["queue"]["count"]) == queue > 0


def test_errors_map_to_grpc_status_codes(client):
    ids, mask = padded_batch([4])
    with pytest.raises(InferenceServerException, match="differs from input_ids") as info:
        client.infer(DEFAULT_MODEL, token_inputs(triton_grpc, ids, mask[:, :2]))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="nope") as info:
        client.get_model_config("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    out_of_vocab = np.full((1, 4), 10**7, dtype=np.int64)
    with pytest.raises(InferenceServerException, match="input_ids") as info:
        client.infer(DEFAULT_MODEL, token_inputs(triton_grpc, out_of_vocab, np.ones_like(ids)))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


async def test_aio_client_concurrent_requests(kserve, embed_alone):
    client = triton_grpc_aio.InferenceServerClient(kserve.grpc_url)
    try:
        assert await client.is_model_ready(DEFAULT_MODEL)
        batches = [padded_batch([n]) for n in (5, 12, 30, 8, 17, 40)]
        results = await asyncio.gather(
            *(client.infer(DEFAULT_MODEL, token_inputs(triton_grpc_aio, i, m)) for i, m in batches)
        )
    finally:
        await client.close()
    for (ids, _), result in zip(batches, results, strict=True):
        embedding = result.as_numpy("sentence_embedding")[0]
        assert np.max(np.abs(embedding - embed_alone(ids[0].tolist()))) <= 1e-5


def test_api_key_guards_inference_but_not_health():
    key = "grpc-key"
    with kserve_server_with_env({"FERRY_API_KEY": key}) as grpc_url:
        client = triton_grpc.InferenceServerClient(grpc_url)
        try:
            assert client.is_server_ready()  # health stays open, as on HTTP
            with pytest.raises(InferenceServerException, match="API key") as info:
                client.get_model_config(DEFAULT_MODEL)
            assert info.value.status() == "StatusCode.UNAUTHENTICATED"
            headers = {"authorization": f"bearer {key}"}  # the scheme in any case
            config = client.get_model_config(DEFAULT_MODEL, headers=headers, as_json=True)
            assert config["config"]["name"] == DEFAULT_MODEL
        finally:
            client.close()
        # Two keys in the metadata: refused, whichever comes first.
        request = service_pb2.ModelConfigRequest(name=DEFAULT_MODEL)
        twice = (("authorization", f"Bearer {key}"), ("authorization", "Bearer wrong"))
        with grpc.insecure_channel(grpc_url) as channel, pytest.raises(grpc.RpcError) as error:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            stub.ModelConfig(request, metadata=twice, timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "2 Authorization headers" in error.value.details()


@contextlib.contextmanager
def kserve_server_with_env(env: dict[str, str]):
    port = free_port()
    with ferry_server(server={"grpc_port": port}, env=env):
        yield f"127.0.0.1:{port}"


def typed_request(datatype: str, **contents) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=DEFAULT_MODEL)
    tensor = request.inputs.add(name="input_ids", datatype=datatype, shape=[1, 2])
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    return request


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (typed_request("INT64", fp32_contents=[101.0, 7592.9]), "got fp32_contents"),
        (typed_request("INT64", bool_contents=[True, False]), "got bool_contents"),
        (typed_request("INT64", int_contents=[101, 102]), "got int_contents"),
        (typed_request("INT32", int64_contents=[101, 102]), "got int64_contents"),
        (typed_request("FP32", fp32_contents=[1.0, 2.0]), "does not match the model's INT64"),
    ],
)
def test_typed_contents_of_the_wrong_type_are_refused_naming_the_input(kserve, request_, named):
    with grpc.insecure_channel(kserve.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request_, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("input_ids:") and named in info.value.details()


def test_raw_contents_that_are_not_whole_values_are_refused(kserve):
    request = typed_request("INT64")
    request.raw_input_contents.append(b"\x01" * 12)  # one and a half INT64s
    with grpc.insecure_channel(kserve.grpc_url) as channel, pytest.raises(grpc.RpcError) as info:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "12 bytes of binary data, but shape [1, 2] of INT64 takes 16" in info.value.details()


def priority_request(set_value) -> service_pb2.ModelInferRequest:
    """A valid request whose `priority` parameter `set_value` fills (or leaves without one)."""
    request = typed_request("INT64", int64_contents=[101, 102])
    set_value(request.parameters["priority"])
    return request


@pytest.mark.parametrize(
    ("set_value", "code"),
    [
        (lambda p: None, grpc.StatusCode.INVALID_ARGUMENT),  # sent without a value: null
        (lambda p: setattr(p, "int64_param", 2**31), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda p: setattr(p, "string_param", "1"), grpc.StatusCode.INVALID_ARGUMENT),
        # Priority is a privilege (server/tenancy.py): none for a call without a key.
        (lambda p: setattr(p, "int64_param", -10), grpc.StatusCode.PERMISSION_DENIED),
    ],
    ids=["null", "2**31", "string", "keyless -10"],
)
def test_a_priority_out_of_bounds_or_not_allowed_is_refused_naming_it(kserve, set_value, code):
    with grpc.insecure_channel(kserve.grpc_url) as channel, pytest.raises(grpc.RpcError) as info:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            priority_request(set_value), timeout=30
        )
    assert info.value.code() == code
    assert info.value.details().startswith("priority:"), info.value.details()


def test_a_priority_within_bounds_is_served(kserve):
    with grpc.insecure_channel(kserve.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for value in (0, 2**31 - 1):
            request = priority_request(lambda p, v=value: setattr(p, "int64_param", v))
            assert stub.ModelInfer(request, timeout=30).outputs
