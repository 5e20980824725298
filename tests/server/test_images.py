"""Image models served by a real `ferry serve` process: scikit-learn's sample photos, cropped to
several sizes and sent as JPEG or PNG (a raw body and base64 JSON on /predict, BYTES on KServe
HTTP and gRPC through tritonclient), each answer checked against ONNX Runtime run alone on the
reference preprocessing's tensor; images of different sizes batched together; bad images
refused naming the input."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ferry.bench.processes import free_port
from ferry.bench.server_process import ferry_server
from tests.server.conftest import IN_PROCESS
from tests.support import images
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

PROTOCOLS = ("raw", "base64", "records", "kserve-json", "kserve-binary", "grpc", "grpc-typed")
# Preprocessing from the graph's metadata, from the config, from the folder's ferry_model.json.
MODELS = ("cnn", "configured", "folder")
QUEUE = 4  # configured's max_queue_size


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    model_folder = folder / "folder"  # model.onnx and ferry_model.json, as an export writes
    model_folder.mkdir()
    images.tiny_cnn(model_folder / "model.onnx", declare=False)
    manifest = {"task": "image", "preprocess": images.PREPROCESS}
    (model_folder / "ferry_model.json").write_text(json.dumps(manifest))
    return {
        "folder": model_folder,
        "declared": images.tiny_cnn(folder / "cnn.onnx"),
        "bare": images.tiny_cnn(folder / "bare.onnx", declare=False),
        "any_size": images.tiny_cnn(folder / "any.onnx", spatial=("height", "width")),
    }


# Decoding and its refusals are the API process's; engine batching over the hop:
# test_batching_corpus.py.
@pytest.fixture(scope="module", params=IN_PROCESS)
def server(graphs, request):
    models = [
        {
            "name": "configured",
            "path": str(graphs["bare"]),
            "preprocess": images.PREPROCESS,
            "batching": {"max_queue_size": QUEUE},  # also the images waiting to be decoded
        },
        {"name": "plain", "path": str(graphs["bare"])},  # no preprocessing: tensors only
        {"name": "any_size", "path": str(graphs["any_size"])},  # its height and width dynamic
    ]
    # Waits for company, so that concurrent images of different sizes share batches.
    wait = {}
    for name in ("CNN", "ANY_SIZE"):
        wait[f"FERRY_MODEL__{name}__BATCHING__DISPATCH_WHEN_IDLE"] = "false"
        wait[f"FERRY_MODEL__{name}__BATCHING__MAX_QUEUE_DELAY_S"] = "0.05"

    grpc_port = free_port()
    args = ["--model", f"cnn={graphs['declared']}", "--model", str(graphs["folder"])]
    options = {"grpc_port": grpc_port, "api_servers": request.param}
    with ferry_server(models, options, env=wait, args=args) as handle:
        handle.grpc_url = f"127.0.0.1:{grpc_port}"
        yield handle


@pytest.fixture(scope="module")
def session(graphs) -> ort.InferenceSession:
    return ort.InferenceSession(str(graphs["bare"]))


def alone(session: ort.InferenceSession, encoded: list[bytes]) -> np.ndarray:
    pixels = np.stack([images.reference(data) for data in encoded])
    return session.run(["logits"], {"pixel_values": pixels})[0]


def text(data: bytes) -> str:
    return base64.b64encode(data).decode()


def send(server, protocol: str, model: str, encoded: list[bytes]) -> httpx.Response | np.ndarray:
    """The logits [N, 5], or the refusal (an httpx response, or tritonclient's exception)."""
    url = server.url
    if protocol == "raw":
        (data,) = encoded
        kind = "image/png" if data.startswith(b"\x89PNG") else "image/jpeg"
        reply = httpx.post(
            f"{url}/predict?model={model}", content=data, headers={"content-type": kind}
        )
    elif protocol in ("base64", "records"):
        strings = [text(data) for data in encoded]
        inputs = (
            {"pixel_values": strings}
            if protocol == "base64"
            else [{"pixel_values": s} for s in strings]
        )
        reply = httpx.post(f"{url}/predict", json={"model": model, "inputs": inputs}, timeout=30)
    elif protocol == "kserve-json":
        tensor = {
            "name": "pixel_values",
            "datatype": "BYTES",
            "shape": [len(encoded)],
            "data": [text(data) for data in encoded],
        }
        reply = httpx.post(f"{url}/v2/models/{model}/infer", json={"inputs": [tensor]}, timeout=30)
    elif protocol == "grpc-typed":
        return grpc_typed_send(server, model, encoded)
    else:
        return tritonclient_send(server, protocol, model, encoded)
    if reply.status_code != 200:
        return reply
    body = reply.json()
    if protocol == "kserve-json":
        (output,) = body["outputs"]
        return np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    return np.array([row["logits"] for row in body["outputs"]], dtype=np.float32)


def tritonclient_send(server, protocol: str, model: str, encoded: list[bytes]) -> np.ndarray:
    module = triton_grpc if protocol == "grpc" else triton_http
    tensor = module.InferInput("pixel_values", [len(encoded)], "BYTES")
    array = np.array(encoded, dtype=object)
    if protocol == "grpc":
        tensor.set_data_from_numpy(array)
        client = triton_grpc.InferenceServerClient(server.grpc_url)
    else:
        tensor.set_data_from_numpy(array, binary_data=True)
        client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    with client:
        return client.infer(model, [tensor]).as_numpy("logits")


def grpc_typed_send(server, model: str, encoded: list[bytes]) -> np.ndarray:
    """gRPC with the images in typed `bytes_contents` (tritonclient sends raw contents)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="pixel_values", datatype="BYTES", shape=[len(encoded)])
    tensor.contents.bytes_contents.extend(encoded)
    with grpc.insecure_channel(server.grpc_url) as channel:
        reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    (output,) = reply.outputs
    return np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(output.shape)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_images_of_every_size_answer_as_onnxruntime_alone(server, session, protocol, model):
    # JPEG and PNG, landscape, portrait, square and smaller than the crop.
    batches = [[images.encoded(i, "PNG" if i % 2 else "JPEG")] for i in range(6)]
    if protocol != "raw":  # one request of several sizes too
        batches.append([images.encoded(i, "PNG" if i % 3 else "JPEG") for i in range(6, 10)])
    for encoded in batches:
        answer = send(server, protocol, model, encoded)
        assert isinstance(answer, np.ndarray), answer.text
        np.testing.assert_allclose(answer, alone(session, encoded), rtol=1e-4, atol=1e-4)


def test_images_of_mixed_sizes_batch_together_and_a_bad_one_fails_alone(server, session):
    before = metric_value(server.metrics(), "ferry_batch_size_requests_count", model="cnn")
    requests = [[images.encoded(i, "PNG" if i % 4 == 0 else "JPEG")] for i in range(32)]
    protocols = ["kserve-binary", "grpc", "base64", "raw"]

    def one(index: int):
        return send(server, protocols[index % 4], "cnn", requests[index])

    with ThreadPoolExecutor(16) as pool:
        bad = pool.submit(send, server, "raw", "cnn", [b"\xff\xd8 not really a jpeg"])
        answers = list(pool.map(one, range(len(requests))))
    assert bad.result().status_code == 422
    for encoded, answer in zip(requests, answers, strict=True):
        assert isinstance(answer, np.ndarray), answer.text
        np.testing.assert_allclose(answer, alone(session, encoded), rtol=1e-4, atol=1e-4)
    batches = metric_value(server.metrics(), "ferry_batch_size_requests_count", model="cnn")
    assert batches - before < len(requests), "no two images shared a batch"


def test_the_graphs_own_tensor_still_passes_through(server, session):
    pixels = np.stack([images.reference(images.encoded(i)) for i in range(3)])
    tensor = triton_http.InferInput("pixel_values", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=True)
    with triton_http.InferenceServerClient(server.url.removeprefix("http://")) as client:
        answer = client.infer("cnn", [tensor]).as_numpy("logits")
    expected = session.run(["logits"], {"pixel_values": pixels})[0]
    np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)


def test_tensors_of_other_sizes_are_never_padded_into_an_images_batch(server, session, graphs):
    # The graph takes any height and width; its preprocessing crops to 32 x 32. Tensors of other
    # sizes sent alongside must not be padded to one another's (that changes their answers).
    any_size = ort.InferenceSession(str(graphs["any_size"]))
    rng = np.random.default_rng(3)
    shapes = [(1, 3, 32, 32), (1, 3, 40, 48), (2, 3, 24, 24), (1, 3, 40, 48)] * 4
    tensors = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]

    def one(pixels: np.ndarray) -> np.ndarray:
        tensor = triton_http.InferInput("pixel_values", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels, binary_data=True)
        with triton_http.InferenceServerClient(server.url.removeprefix("http://")) as client:
            return client.infer("any_size", [tensor]).as_numpy("logits")

    with ThreadPoolExecutor(len(tensors)) as pool:
        answers = list(pool.map(one, tensors))
        jpeg = pool.submit(send, server, "raw", "any_size", [images.encoded(5)]).result()
    for pixels, answer in zip(tensors, answers, strict=True):
        expected = any_size.run(["logits"], {"pixel_values": pixels})[0]
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jpeg, alone(session, [images.encoded(5)]), rtol=1e-4, atol=1e-4)


BAD = b"GIF89a not what this model decodes"


@pytest.mark.parametrize(
    ("protocol", "field"),
    [("raw", "pixel_values"), ("base64", "pixel_values[1]"), ("records", "pixel_values[1]")],
)
def test_predict_refuses_a_bad_image_naming_the_input(server, protocol, field):
    encoded = [BAD] if protocol == "raw" else [images.encoded(0), BAD]
    reply = send(server, protocol, "cnn", encoded)
    assert reply.status_code == 422
    assert reply.json()["error"]["param"] == field
    assert "not a JPEG or PNG image" in reply.json()["error"]["message"]


@pytest.mark.parametrize("protocol", ["kserve-json", "kserve-binary", "grpc"])
def test_kserve_refuses_a_bad_image_naming_the_input(server, protocol):
    encoded = [images.encoded(0), BAD]
    if protocol == "kserve-json":
        reply = send(server, protocol, "cnn", encoded)
        assert reply.status_code == 400
        message = reply.json()["error"]
    else:
        with pytest.raises(InferenceServerException) as refused:
            send(server, protocol, "cnn", encoded)
        message = refused.value.message()
        if protocol == "grpc":
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message.startswith("pixel_values[1]: not a JPEG or PNG image"), message


def test_bad_base64_is_refused_naming_the_item(server):
    reply = httpx.post(
        f"{server.url}/predict",
        json={"model": "cnn", "inputs": {"pixel_values": [text(images.encoded(0)), "%%%"]}},
    )
    assert reply.status_code == 422
    assert reply.json()["error"]["param"] == "pixel_values[1]"


def test_a_raw_image_needs_a_model_that_decodes_images(server):
    headers = {"content-type": "image/jpeg"}
    data = images.encoded(0)
    plain = httpx.post(f"{server.url}/predict?model=plain", content=data, headers=headers)
    assert plain.status_code == 422
    assert "declares no image preprocessing" in plain.json()["error"]["message"]
    unknown = httpx.post(f"{server.url}/predict?model=cnn&top=3", content=data, headers=headers)
    assert unknown.status_code == 422
    assert unknown.json()["error"]["param"] == "top"
    # Without preprocessing, BYTES is not the graph's datatype: refused as any other.
    reply = send(server, "kserve-json", "plain", [data])
    assert reply.status_code == 400
    assert "datatype BYTES does not match the model's FP32" in reply.text


@pytest.mark.parametrize(("shape", "status"), [([2, 1], 200), ([1, 2], 400), ([2], 200)])
def test_encoded_images_come_one_per_row(server, session, shape, status):
    encoded = [images.encoded(0), images.encoded(1)]
    tensor = {"name": "pixel_values", "datatype": "BYTES", "shape": shape}
    body = {"inputs": [{**tensor, "data": [text(data) for data in encoded]}]}
    reply = httpx.post(f"{server.url}/v2/models/cnn/infer", json=body, timeout=30)
    if status != 200:
        assert reply.status_code == 400
        assert reply.json()["error"].startswith("pixel_values: encoded images come one per row")
        return
    (output,) = reply.json()["outputs"]
    answer = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(answer, alone(session, encoded), rtol=1e-4, atol=1e-4)


def test_more_images_than_the_queue_ever_holds_are_a_413_naming_the_input(server):
    # No retry could lift it: not a 429.
    reply = send(server, "base64", "configured", [images.encoded(i) for i in range(QUEUE + 1)])
    assert reply.status_code == 413 and "Retry-After" not in reply.headers
    error = reply.json()["error"]
    assert error["param"] == "pixel_values" and "decodes at most 4 at once" in error["message"]
