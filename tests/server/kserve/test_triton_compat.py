"""What Triton's clients check of a Triton server, on Ferry serving Triton's example models
(tests/support/triton_example_models.py): model versions, unknown models in Triton's words,
HTTP compression both ways, the server metadata and the input `format` of image models."""

from __future__ import annotations

import gzip
import zlib
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ferry.server.kserve.extensions import SERVED

pytestmark = pytest.mark.integration

SIMPLE_INPUTS = {
    "inputs": [
        {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
        for n in ("INPUT0", "INPUT1")
    ]
}
UNKNOWN_SIMPLE_7 = "Request for unknown model: 'simple' version 7 is not found"


@pytest.fixture(scope="module")
def http(triton_models):
    with httpx.Client(base_url=triton_models.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def stub(triton_models):
    with grpc.insecure_channel(triton_models.grpc_address) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/models/simple/versions/7"),
        ("GET", "/v2/models/simple/versions/7/config"),
        ("GET", "/v2/models/simple/versions/7/ready"),
        ("GET", "/v2/models/simple/versions/7/stats"),
        ("POST", "/v2/models/simple/versions/7/infer"),
    ],
)
def test_a_version_not_served_is_404_in_tritons_words(http, method, path):
    reply = http.request(method, path, json=SIMPLE_INPUTS if method == "POST" else None)
    assert reply.status_code == 404
    assert reply.json() == {"error": UNKNOWN_SIMPLE_7}


def test_the_served_version_answers(http):
    assert http.get("/v2/models/simple/versions/1").json()["versions"] == ["1"]
    reply = http.post("/v2/models/simple/versions/1/infer", json=SIMPLE_INPUTS)
    assert reply.json()["outputs"][0]["data"] == [2 * i for i in range(16)]


@pytest.mark.parametrize("version", ["wrong_specification", "-1"])
def test_a_version_that_is_no_version_is_refused(http, version):
    reply = http.get(f"/v2/models/simple/versions/{version}/config")
    assert 400 <= reply.status_code < 500
    assert "version should be an integral value > 0" in reply.json()["error"]


def test_grpc_versions(stub):
    with pytest.raises(grpc.RpcError) as unknown:
        stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="simple", version="7"))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert unknown.value.details() == UNKNOWN_SIMPLE_7
    request = service_pb2.ModelInferRequest(model_name="simple", model_version="x")
    with pytest.raises(grpc.RpcError) as wrong:
        stub.ModelInfer(request)
    assert wrong.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failed to get model version from specified version string 'x'" in (
        wrong.value.details()
    )
    ready = stub.ModelReady(service_pb2.ModelReadyRequest(name="simple", version="1"))
    assert ready.ready


def test_an_unknown_model_is_tritons_message_without_the_model_list(triton_models):
    expected = "Request for unknown model: 'nope' is not found"
    with (
        triton_http.InferenceServerClient(triton_models.http_address) as client,
        pytest.raises(InferenceServerException) as on_http,
    ):
        client.get_model_metadata("nope")
    assert on_http.value.message() == expected
    with (
        triton_grpc.InferenceServerClient(triton_models.grpc_address) as client,
        pytest.raises(InferenceServerException) as on_grpc,
    ):
        client.get_model_config("nope")
    assert on_grpc.value.message() == expected


def test_server_metadata_lists_what_is_served(triton_models, http):
    assert http.get("/v2").json()["extensions"] == list(SERVED)
    with triton_grpc.InferenceServerClient(triton_models.grpc_address) as client:
        metadata = client.get_server_metadata()
    assert (metadata.name, list(metadata.extensions)) == ("triton", list(SERVED))


def test_image_inputs_say_their_format(triton_models, http):
    config = http.get("/v2/models/densenet_onnx/config").json()
    assert [i["format"] for i in config["input"]] == ["FORMAT_NCHW"]
    assert [i["format"] for i in http.get("/v2/models/simple/config").json()["input"]] == [
        "FORMAT_NONE"
    ] * 2
    with triton_grpc.InferenceServerClient(triton_models.grpc_address) as client:
        parsed = client.get_model_config("densenet_onnx").config
    assert triton_grpc.model_config_pb2.ModelInput.Format.Name(parsed.input[0].format) == (
        "FORMAT_NCHW"
    )


# -- compression ------------------------------------------------------------------------------


def floats_request(count: int) -> tuple[bytes, np.ndarray]:
    values = np.arange(count, dtype=np.float32)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, count]}]}
    body["inputs"][0]["data"] = values.tolist()
    return httpx.Request("POST", "/", json=body).content, values


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("GZip", gzip.compress)],
)
def test_compressed_requests_are_inflated(http, encoding, pack):
    body, values = floats_request(100)
    reply = http.post(
        "/v2/models/onnx_zero_1_float32/infer",
        content=pack(body),
        headers={"content-encoding": encoding, "content-type": "application/json"},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == values.tolist()


def test_a_zip_bomb_is_413(http):
    """5 MB of spaces after the JSON (over the 4 MiB max_body_bytes), sent as ~5 KB."""
    body, _ = floats_request(4)
    bomb = gzip.compress(body + b" " * (5 * 2**20))
    assert len(bomb) < 10_000
    reply = http.post(
        "/v2/models/onnx_zero_1_float32/infer",
        content=bomb,
        headers={"content-encoding": "gzip", "content-type": "application/json"},
    )
    assert reply.status_code == 413
    assert "4194304-byte limit" in reply.json()["error"]


@pytest.mark.parametrize(
    ("encoding", "status"), [("br", 415), ("gzip", 400)]
)  # an unknown coding; a body that is not gzip at all
def test_what_cannot_be_inflated_is_refused(http, encoding, status):
    body, _ = floats_request(4)
    reply = http.post(
        "/v2/models/onnx_zero_1_float32/infer",
        content=body,
        headers={"content-encoding": encoding, "content-type": "application/json"},
    )
    assert reply.status_code == status
    assert reply.json()["error"].startswith("Content-Encoding: ")


@pytest.mark.parametrize(("accept", "coding"), [("gzip", "gzip"), ("deflate", "deflate")])
def test_answers_come_compressed_when_accepted(http, accept, coding):
    body, values = floats_request(2000)
    # httpx inflates what it gets; the raw stream says how it came.
    with http.stream(
        "POST",
        "/v2/models/onnx_zero_1_float32/infer",
        content=body,
        headers={"accept-encoding": accept, "content-type": "application/json"},
    ) as reply:
        raw = b"".join(reply.iter_raw())
        assert reply.headers["content-encoding"] == coding
    inflated = zlib.decompress(raw, 31 if coding == "gzip" else 15)
    assert len(raw) < len(inflated)
    assert httpx.Response(200, content=inflated).json()["outputs"][0]["data"] == values.tolist()


def test_answers_are_plain_unless_accepted(http):
    body, _ = floats_request(2000)
    for accept in ("identity", "gzip;q=0"):
        reply = http.post(
            "/v2/models/onnx_zero_1_float32/infer",
            content=body,
            headers={"accept-encoding": accept, "content-type": "application/json"},
        )
        assert "content-encoding" not in reply.headers


# -- trace and log settings -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/trace/setting", "/v2/models/simple/trace/setting"])
def test_trace_settings_read_off_and_stay_off(http, path):
    assert http.get(path).json()["trace_level"] == ["OFF"]
    assert http.post(path, json={}).json()["trace_level"] == ["OFF"]
    assert http.post(path, json={"trace_level": ["OFF"], "trace_rate": None}).status_code == 200
    on = http.post(path, json={"trace_level": ["TIMESTAMPS"]})
    assert on.status_code == 400
    assert on.json()["error"].startswith("trace_level: Ferry does not trace requests")


def test_an_unknown_models_trace_settings_are_404(http):
    assert http.get("/v2/models/nope/trace/setting").status_code == 404


def test_log_settings_read_the_log_level_and_cannot_change(triton_models, http):
    settings = http.get("/v2/logging").json()
    assert (settings["log_warning"], settings["log_info"]) == (True, False)  # "warning"
    assert http.post("/v2/logging", json=settings).json() == settings
    changed = http.post("/v2/logging", json={"log_verbose_level": 1})
    assert changed.status_code == 400
    assert changed.json()["error"].startswith("log_verbose_level: Ferry's logging is set at start")


def inference_count(client, model: str) -> int:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"])


def test_inference_count_counts_rows_as_triton_does(triton_models):
    """Triton: +8 for a request of 8 rows."""
    with triton_http.InferenceServerClient(triton_models.http_address) as client:
        before = inference_count(client, "simple_int8")
        rows = np.ones((8, 16), dtype=np.int8)
        inputs = [triton_http.InferInput(n, [8, 16], "INT8") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(rows)
        client.infer("simple_int8", inputs)
        assert inference_count(client, "simple_int8") - before == 8


def test_an_unsupported_grpc_call_is_unimplemented_without_a_traceback(triton_models, stub):
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as refused:
            stub.LogSettings(service_pb2.LogSettingsRequest())
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert refused.value.details() == "LogSettings is not supported by Ferry"
    log = triton_models.log_path.read_text()
    assert "NotImplementedError" not in log and "Traceback" not in log


@pytest.mark.parametrize("model", ["simple_identity", "onnx_zero_1_object", "onnx_zero_1_float32"])
def test_identity_answers_are_each_requests_own_under_16_clients(triton_models, model):
    """Triton's identity models, each variable axis named apart: 16 clients at once, rows and
    lengths all different, every answer the request itself."""
    rng = np.random.default_rng(7)
    strings = "BYTES" if model != "onnx_zero_1_float32" else "FP32"

    def request(i: int) -> np.ndarray:
        rows, width = int(rng.integers(1, 4)), int(rng.integers(1, 12))
        if strings == "BYTES":
            data = np.array(
                [
                    [f"{i}-{r}-{c}" * int(rng.integers(1, 5)) for c in range(width)]
                    for r in range(rows)
                ],
                dtype=object,
            )
        else:
            data = rng.standard_normal((rows, width)).astype(np.float32)
        return data

    def send(data: np.ndarray) -> np.ndarray:
        with triton_http.InferenceServerClient(triton_models.http_address) as client:
            tensor = triton_http.InferInput("INPUT0", list(data.shape), strings)
            tensor.set_data_from_numpy(data)
            answer = client.infer(model, [tensor]).as_numpy("OUTPUT0")
        return answer.astype(object) if strings == "BYTES" else answer

    requests = [request(i) for i in range(64)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, requests))
    for sent, got in zip(requests, answers, strict=True):
        if strings == "BYTES":
            sent = np.vectorize(lambda s: s.encode())(sent).astype(object)
        assert got.shape == sent.shape and (got == sent).all()


def test_a_chunked_raw_binary_request_is_served(http):
    """Triton's raw form (the body one input's bytes), sent chunked without Content-Length,
    as qa's test_content_encoding_chunked_manually means to."""
    values = np.arange(8, dtype=np.float32)

    def chunks():
        yield values[:3].tobytes()
        yield values[3:].tobytes()

    reply = http.post(
        "/v2/models/onnx_zero_1_float32/infer",
        content=chunks(),
        headers={"inference-header-content-length": "0"},
    )
    assert reply.status_code == 200, reply.text
    header = int(reply.headers["inference-header-content-length"])
    assert reply.content[header:] == values.tobytes()
