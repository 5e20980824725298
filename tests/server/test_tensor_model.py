"""Plain ONNX graphs served by a real `ferry serve --model ...` process, every answer checked
against ONNX Runtime run on that request alone, under concurrency, over KServe v2 HTTP
(tritonclient) and /predict; in both modes (API processes in front of an engine process too)."""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import ml_dtypes  # tritonclient's BF16 (a dependency of it)
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from ferry.bench.processes import free_port
from ferry.bench.server_process import DEFAULT_MODEL, default_model_config, ferry_server
from ferry.server.graph_runtime import GraphRuntime
from ferry.server.large_bodies import LARGE_BODY_BYTES
from ferry.server.metrics import FerryMetrics
from ferry.server.settings import ModelSettings
from tests.server.conftest import API_SERVERS
from tests.support import plain_graphs
from tests.support.liveness import LivenessProbe
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

RNG = np.random.default_rng(34)
CLIENTS = 16
TYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
TYPE_NAMES = {np.dtype(t): d for d, t in TYPES.items()} | {np.dtype(ml_dtypes.bfloat16): "BF16"}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("graphs")
    return {
        "masked": plain_graphs.masked_mean(folder / "masked_mean.onnx"),
        "unnamed": plain_graphs.masked_mean(folder / "unnamed.onnx", axis=None),
        "every_type": plain_graphs.every_type(folder / "every_type.onnx"),
        "bf16": plain_graphs.bfloat16(folder / "bf16.onnx"),
        "gb": plain_graphs.breast_cancer(folder / "gb.onnx", "gradient_boosting"),
        "lr": plain_graphs.breast_cancer(folder / "lr.onnx", "logistic_regression"),
        "xgb": plain_graphs.breast_cancer(folder / "xgb.onnx", "xgboost"),
        "lgbm": plain_graphs.breast_cancer(folder / "lgbm.onnx", "lightgbm"),
        "iris": plain_graphs.iris_graph(),
        "iris_by_name": plain_graphs.iris_by_name(folder / "iris_by_name.onnx"),
        "colour": plain_graphs.colour_classifier(folder / "colour.onnx"),
    }


CHUNKED = {"max_batch_size": 3, "max_queue_size": 8}
BREAST_CANCER_LABELS = ("malignant", "benign")  # classes 0 and 1 of scikit-learn's data


@pytest.fixture(scope="module", params=API_SERVERS)
def server(graphs, request):
    # Waits for company (no dispatch while idle), so concurrent requests share padded batches.
    wait = {}
    for name in ("MASKED", "UNPADDED", "UNNAMED"):
        wait[f"FERRY_MODEL__{name}__BATCHING__DISPATCH_WHEN_IDLE"] = "false"
        wait[f"FERRY_MODEL__{name}__BATCHING__MAX_QUEUE_DELAY_S"] = "0.02"
    # Models from [[models]] entries naming a plain file (beside the default text encoder,
    # still the default model); the rest from --model.
    config_entries = [
        default_model_config(),
        {
            "name": "lr",
            "path": str(graphs["lr"]),
            "outputs": ["output_probability"],
            "labels": {"output_probability": list(BREAST_CANCER_LABELS)},
        },
        {"name": "unpadded", "path": str(graphs["masked"]), "pad_axes": []},
        # Batches of 3 rows at most (larger requests go in chunks, each a queue member); 8 queued.
        *(
            {"name": f"{n}_chunked", "path": str(graphs[n]), "batching": CHUNKED}
            for n in ("gb", "masked")
        ),
    ]
    args = ["--model", f"masked={graphs['masked']}", "--model", str(graphs["every_type"])]
    args += ["--model", f"gb={graphs['gb']}", "--model", str(graphs["iris"])]
    args += ["--model", f"xgb={graphs['xgb']}", "--model", f"lgbm={graphs['lgbm']}"]
    args += ["--model", str(graphs["iris_by_name"]), "--model", str(graphs["unnamed"])]
    args += ["--model", str(graphs["bf16"])]
    args += ["--model", str(graphs["colour"])]
    grpc_port = free_port()
    options = {"grpc_port": grpc_port, "api_servers": request.param}
    with ferry_server(config_entries, options, env=wait, args=args) as handle:
        handle.grpc_url = f"127.0.0.1:{grpc_port}"
        yield handle


@pytest.fixture(scope="module")
def sessions(graphs) -> dict[str, ort.InferenceSession]:
    return {name: ort.InferenceSession(str(path)) for name, path in graphs.items()}


def alone(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference: the request run by itself; ZipMap's maps as [N, C] in key order."""
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, feeds)
    return {
        n: np.array([list(m.values()) for m in v]) if isinstance(v, list) else v
        for n, v in zip(names, values, strict=True)
    }


def infer(
    server, model: str, inputs: list[dict], outputs: list[str] | None = None, padding: int = 0
):
    """`padding`: that many spaces after the JSON (LARGE_BODY_BYTES: a worker parses it)."""
    body: dict = {"inputs": inputs}
    if outputs:
        body["outputs"] = [{"name": n} for n in outputs]
    payload = json.dumps(body).encode() + b" " * padding
    headers = {"content-type": "application/json"}
    url = f"{server.url}/v2/models/{model}/infer"
    return httpx.post(url, content=payload, headers=headers, timeout=30)


def kserve_input(name: str, array: np.ndarray) -> dict:
    datatype = TYPE_NAMES[array.dtype]
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "data": array.ravel().tolist(),
    }


def client(server, protocol: str = "http"):
    if protocol == "grpc":
        return triton_grpc.InferenceServerClient(server.grpc_url)
    return triton_http.InferenceServerClient(server.url.removeprefix("http://"), concurrency=4)


def client_infer(
    server, protocol: str, model: str, feeds: dict[str, np.ndarray], outputs, class_count=0
):
    """tritonclient's way, binary tensors over HTTP and raw contents over gRPC; `class_count`:
    each output as its top classes (Triton's classification extension)."""
    module = triton_grpc if protocol == "grpc" else triton_http
    inputs = []
    for name, array in feeds.items():
        datatype = "BYTES" if array.dtype == object else TYPE_NAMES[array.dtype]
        tensor = module.InferInput(name, list(array.shape), datatype)
        if protocol == "grpc":
            tensor.set_data_from_numpy(array)
        else:
            tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    wanted = [module.InferRequestedOutput(n, class_count=class_count) for n in outputs]
    with client(server, protocol) as triton:
        result = triton.infer(model, inputs, outputs=wanted)
    return {n: result.as_numpy(n) for n in outputs}


# -- signature and metadata -----------------------------------------------------------------------


def test_metadata_comes_from_the_graph(server):
    with client(server) as triton:
        masked = triton.get_model_metadata("masked")
        gb = triton.get_model_metadata("gb")
        iris_config = triton.get_model_config("logreg_iris")
        masked_config = triton.get_model_config("masked")
        assert triton.is_model_ready("masked") and triton.is_model_ready("logreg_iris")
        stats = triton.get_inference_statistics("gb")["model_stats"]
    assert [m["name"] for m in stats] == ["gb"]
    assert masked["inputs"] == [
        {"name": "data", "datatype": "FP32", "shape": [-1, -1]},
        {"name": "mask", "datatype": "INT64", "shape": [-1, -1]},
    ]
    assert [o["name"] for o in masked["outputs"]] == ["mean", "masked"]
    assert gb["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 30]}]
    probability = gb["outputs"][1]
    assert probability["shape"] == [-1, 2]
    assert probability["parameters"] == {"classes": ["0", "1"]}
    # A fixed first axis: served one request at a time, its full shape in the config.
    assert iris_config["max_batch_size"] == 0
    assert iris_config["input"] == [
        {"name": "float_input", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [3, 2]}
    ]
    assert masked_config["max_batch_size"] > 0
    assert masked_config["input"][0]["dims"] == [-1]  # the batch axis is implicit
    with client(server, "grpc") as triton:
        over_grpc = triton.get_model_metadata("gb", as_json=True)
        grpc_config = triton.get_model_config("logreg_iris", as_json=True)["config"]
    assert over_grpc["inputs"] == [{"name": "X", "datatype": "FP32", "shape": ["-1", "30"]}]
    assert grpc_config["input"][0]["dims"] == ["3", "2"]


@pytest.mark.parametrize(
    ("model", "name", "array", "words"),
    [
        ("gb", "X", np.ones((1, 30), np.float64), "datatype FP64 does not match the model's FP32"),
        # BF16 only where the graph takes BF16: nothing is cast.
        ("gb", "X", np.ones((1, 30), ml_dtypes.bfloat16), "datatype BF16 does not match"),
        ("bf16", "x", np.ones((1, 2), np.float32), "datatype FP32 does not match the model's BF16"),
    ],
)
def test_grpc_refuses_a_wrong_datatype_naming_the_input(server, model, name, array, words):
    tensor = triton_grpc.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    with client(server, "grpc") as triton, pytest.raises(InferenceServerException) as error:
        triton.infer(model, [tensor])
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.value.message().startswith(f"{name}: {words}")


# -- padding --------------------------------------------------------------------------------------


def masked_request(rows: int, width: int | None = None) -> dict[str, np.ndarray]:
    """Rows of one width (a request is rectangular), each with its own real length."""
    width = width or int(RNG.integers(1, 40))
    data = RNG.normal(size=(rows, width)).astype(np.float32)
    mask = np.zeros((rows, width), dtype=np.int64)
    for row in range(rows):
        mask[row, : int(RNG.integers(1, width + 1))] = 1
    return {"data": data, "mask": mask}


def send_masked(server, model: str, requests: list[dict[str, np.ndarray]]) -> list[dict]:
    def send(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        reply = infer(server, model, [kserve_input(n, a) for n, a in feeds.items()])
        assert reply.status_code == 200, reply.text
        return {
            o["name"]: np.array(o["data"], dtype=np.float32).reshape(o["shape"])
            for o in reply.json()["outputs"]
        }

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(send, requests))


def test_rows_of_different_lengths_batched_together_answer_as_alone(server, sessions):
    before = metric_value(server.metrics(), "ferry_batch_size_requests_count", model="masked")
    requests = [masked_request(rows=int(RNG.integers(1, 4))) for _ in range(48)]
    answers = send_masked(server, "masked", requests)
    for feeds, answer in zip(requests, answers, strict=True):
        expected = alone(sessions["masked"], feeds)
        assert answer["masked"].shape == feeds["data"].shape  # cut back to its own width
        np.testing.assert_allclose(answer["mean"], expected["mean"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(answer["masked"], expected["masked"], rtol=1e-6, atol=1e-6)
    text = server.metrics()
    batches = metric_value(text, "ferry_batch_size_requests_count", model="masked") - before
    assert batches < len(requests), "no two requests shared a batch: padding went untested"
    assert metric_value(text, "ferry_batch_padding_ratio_sum", model="masked") > 0


@pytest.mark.parametrize("route", ["kserve", "predict"])
def test_a_body_near_the_size_limit_does_not_freeze_the_server(server, sessions, route):
    """Issue 35: ~3 MB of JSON tensors are parsed and typed off the event loop
    (server/large_bodies.py), and the answer is still the request's run alone."""
    length = 250_000
    data = RNG.random((1, length)).round(3)
    mask = np.ones((1, length), np.int64)
    if route == "kserve":
        path = "/v2/models/masked/infer"
        body = {
            "inputs": [kserve_input("data", data.astype(np.float32)), kserve_input("mask", mask)],
            "outputs": [{"name": "mean"}],
        }
        body["inputs"][0]["data"] = data.ravel().tolist()  # short decimals, not float32's
    else:
        path = "/predict"
        body = {"model": "masked", "inputs": {"data": data.tolist(), "mask": mask.tolist()}}
        body["outputs"] = ["mean"]
    payload = json.dumps(body).encode()
    assert LARGE_BODY_BYTES * 8 < len(payload) < 4 * 1024 * 1024  # under max_body_bytes
    headers = {"content-type": "application/json"}
    with LivenessProbe(server.url) as probe:
        answer = httpx.post(f"{server.url}{path}", content=payload, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    probe.assert_lively()
    feeds = {"data": data.astype(np.float32), "mask": mask}
    expected = alone(sessions["masked"], feeds)["mean"]
    reply = answer.json()
    mean = reply["outputs"][0]["data"] if route == "kserve" else reply["outputs"][0]["mean"]
    np.testing.assert_allclose(np.ravel(mean), np.ravel(expected), rtol=1e-5)


# Configured so (pad_axes = []), or unnamed in the graph (no output can be tied to it).
@pytest.mark.parametrize("model", ["unpadded", "unnamed"])
def test_axes_left_unpadded_batch_only_requests_of_equal_size(server, sessions, model):
    requests = [masked_request(rows=1, width=int(RNG.choice([3, 6]))) for _ in range(48)]
    answers = send_masked(server, model, requests)
    for feeds, answer in zip(requests, answers, strict=True):
        expected = alone(sessions["masked"], feeds)
        np.testing.assert_allclose(answer["masked"], expected["masked"], rtol=1e-6, atol=1e-6)
    text = server.metrics()
    batches = metric_value(text, "ferry_batch_size_requests_count", model=model)
    assert batches < len(requests), "no two requests shared a batch"
    assert metric_value(text, "ferry_batch_padding_ratio_sum", model=model) == 0


# -- datatypes ------------------------------------------------------------------------------------


def every_type_feeds(rows: int) -> dict[str, np.ndarray]:
    feeds = {}
    for datatype, dtype in TYPES.items():
        if datatype == "BOOL":
            value = RNG.integers(0, 2, size=(rows, 2)).astype(np.bool_)
        elif datatype.startswith("FP"):
            value = RNG.normal(size=(rows, 2)).astype(dtype)
        else:
            info = np.iinfo(dtype)
            value = np.array([[info.min, info.max]] * rows, dtype=dtype)  # the range's ends
        feeds[f"x_{datatype}"] = value
    return feeds


@pytest.mark.parametrize("protocol", ["http", "json", "large-json", "grpc"])
def test_every_datatype_goes_in_and_comes_back_exactly(server, sessions, protocol):
    requests = [every_type_feeds(rows=int(RNG.integers(1, 3))) for _ in range(12)]
    padding = LARGE_BODY_BYTES if protocol == "large-json" else 0

    def send(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "json" in protocol:  # FP16 as JSON numbers too (tritonclient sends it binary only)
            inputs = [kserve_input(n, a) for n, a in feeds.items()]
            reply = infer(server, "every_type", inputs, padding=padding)
            assert reply.status_code == 200, reply.text
            return {
                o["name"]: np.array(o["data"], dtype=TYPES[o["datatype"]]).reshape(o["shape"])
                for o in reply.json()["outputs"]
            }
        return client_infer(server, protocol, "every_type", feeds, [f"y_{t}" for t in TYPES])

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, requests))
    for feeds, answer in zip(requests, answers, strict=True):
        expected = alone(sessions["every_type"], feeds)
        for name, value in expected.items():
            assert answer[name].dtype == value.dtype, name
            np.testing.assert_array_equal(answer[name], value, err_msg=name)


# -- refusals -------------------------------------------------------------------------------------

GOOD_MASKED = {"data": np.ones((2, 3), np.float32), "mask": np.ones((2, 3), np.int64)}
BAD_KSERVE = [
    # (model, inputs, the field named, words of the message)
    ("masked", [("data", "FP64", [2, 3]), ("mask", "INT64", [2, 3])], "data", "FP64"),
    ("masked", [("data", "FP32", [2, 3]), ("mask", "INT32", [2, 3])], "mask", "INT32"),
    ("masked", [("data", "FP32", [2, 3]), ("mask", "INT64", [2, 4])], "mask", "is 4"),
    ("masked", [("data", "FP32", [2, 3]), ("mask", "INT64", [3, 3])], "mask", "rows"),
    ("masked", [("data", "FP32", [6]), ("mask", "INT64", [2, 3])], "data", "shape [6]"),
    ("masked", [("data", "FP32", [2, 3])], "mask", "missing"),
    ("gb", [("X", "FP32", [1, 29])], "X", "axis 1 must be 30"),
    ("gb", [("X", "FP64", [1, 30])], "X", "FP64"),
    ("logreg_iris", [("float_input", "FP32", [2, 2])], "float_input", "axis 0 must be 3"),
    ("bf16", [("x", "BF16", [1, 2])], "x", "not JSON"),
    ("bf16", [("x", "FP32", [1, 2])], "x", "FP32 does not match the model's BF16"),
]


def _bad_inputs(inputs: list[tuple[str, str, list[int]]]) -> list[dict]:
    entries = []
    for name, datatype, shape in inputs:
        count = int(np.prod(shape))
        data = [True] * count if datatype == "BOOL" else [1] * count
        entries.append({"name": name, "datatype": datatype, "shape": shape, "data": data})
    return entries


@pytest.mark.parametrize(("model", "inputs", "field", "words"), BAD_KSERVE)
def test_a_wrong_datatype_or_shape_is_a_4xx_naming_the_input(server, model, inputs, field, words):
    reply = infer(server, model, _bad_inputs(inputs))
    assert 400 <= reply.status_code < 500, reply.text
    message = reply.json()["error"]
    assert message.startswith(f"{field}:") and words in message, message


BAD_JSON_DATA = [
    ("masked", {"data": [[1.0, True]], "mask": [[1, 1]]}, "data[1]", "boolean"),
    ("masked", {"data": [[1.0, 2.0]], "mask": [[1, 1.5]]}, "mask[1]", "float"),
    ("masked", {"data": [[1.0, 2.0]], "mask": [[1, 2**63]]}, "mask[1]", "range"),
    ("masked", {"data": [[1.0], [2.0, 3.0]], "mask": [[1], [1, 1]]}, "data", "lengths"),
    ("masked", {"data": [[1.0]], "mask": [[1]], "extra": [[1]]}, "extra", "not an input"),
]


@pytest.mark.parametrize("padding", [0, LARGE_BODY_BYTES], ids=["small", "large"])
@pytest.mark.parametrize(("model", "inputs", "field", "words"), BAD_JSON_DATA)
def test_predict_refuses_what_the_graph_cannot_take_naming_it(
    server, model, inputs, field, words, padding
):
    """However large the body: a large one's numbers are made arrays in a worker process
    (json_bodies.py), and what it cannot convert the server names in the same words."""
    payload = json.dumps({"model": model, "inputs": inputs}).encode() + b" " * padding
    headers = {"content-type": "application/json"}
    reply = httpx.post(f"{server.url}/predict", content=payload, headers=headers, timeout=30)
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and words in error["message"], error


KSERVE_BAD_ITEMS = [
    # (input, datatype, data, the item named, words of the message)
    ("data", "FP32", [1.0, True], "data[1]", "boolean"),
    ("data", "FP32", [1.0, "2"], "data[1]", "string"),
    ("mask", "INT64", [1, 1.5], "mask[1]", "float"),
    ("mask", "INT64", [1, 2**63], "mask[1]", "range"),
]


@pytest.mark.parametrize("padding", [0, LARGE_BODY_BYTES], ids=["small", "large"])
def test_a_kserve_json_item_of_the_wrong_kind_is_named_however_large_the_body(server, padding):
    """A large body's numbers are converted in a worker process (json_bodies.py); what it
    cannot convert is refused by the server's own check, in the same words."""
    for name, datatype, data, item, words in KSERVE_BAD_ITEMS:
        good = {"data": np.ones((1, 2), np.float32), "mask": np.ones((1, 2), np.int64)}
        inputs = [kserve_input(n, a) for n, a in good.items() if n != name]
        inputs.append({"name": name, "datatype": datatype, "shape": [1, 2], "data": data})
        reply = infer(server, "masked", inputs, padding=padding)
        assert reply.status_code == 400, reply.text
        message = reply.json()["error"]
        assert message.startswith(f"{item}:") and words in message, message
    broken = httpx.post(
        f"{server.url}/v2/models/masked/infer",
        content=b'{"inputs": [' + b" " * padding,
        headers={"content-type": "application/json"},
    )
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"], broken.text


def test_fp16_as_json_numbers_is_taken_unless_out_of_its_range(server):
    feeds = every_type_feeds(rows=1)
    inputs = [kserve_input(n, a) for n, a in feeds.items()]
    assert infer(server, "every_type", inputs).status_code == 200
    fp16 = next(i for i in inputs if i["name"] == "x_FP16")
    fp16["data"] = [1.5, 70000.0]
    reply = infer(server, "every_type", inputs)
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("x_FP16[1]: 70000.0 is outside FP16's range")


# -- BF16 ------------------------------------------------------------------------------------------


def bf16_alone(session: ort.InferenceSession, x: np.ndarray) -> dict[str, np.ndarray]:
    """The reference for BF16: ONNX Runtime fed an OrtValue of x's bits, the outputs' bits read
    back through ml_dtypes."""
    feed = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16), 16)  # BFLOAT16
    names = [o.name for o in session.get_outputs()]
    values = session.run_with_ort_values(names, {"x": feed})
    answers = {}
    for name, value in zip(names, values, strict=True):
        if value.element_type() == 16:  # no numpy type: its buffer copied through ctypes
            raw = ctypes.string_at(value.data_ptr(), int(np.prod(value.shape())) * 2)
            answers[name] = np.frombuffer(raw, ml_dtypes.bfloat16).reshape(value.shape())
        else:
            answers[name] = value.numpy()
    return answers


@pytest.mark.parametrize("protocol", ["grpc", "http", "json-out"])
def test_bf16_goes_in_and_comes_back_exactly(server, sessions, protocol):
    x = RNG.normal(size=(3, 2)).astype(ml_dtypes.bfloat16)
    expected = bf16_alone(sessions["bf16"], x)
    if protocol == "json-out":  # binary BF16 in, JSON numbers out
        tensor = triton_http.InferInput("x", [3, 2], "BF16")
        tensor.set_data_from_numpy(x, binary_data=True)
        wanted = [triton_http.InferRequestedOutput(n, binary_data=False) for n in expected]
        with client(server) as triton:
            result = triton.infer("bf16", [tensor], outputs=wanted).get_response()
        answer = {
            o["name"]: np.array(o["data"], np.float32).reshape(o["shape"])
            for o in result["outputs"]
        }
        assert [o["datatype"] for o in result["outputs"]] == ["FP32", "BF16", "BF16"]
    else:
        answer = client_infer(server, protocol, "bf16", {"x": x}, list(expected))
    for name, value in expected.items():
        if protocol != "json-out":
            assert answer[name].dtype == value.dtype, name
        np.testing.assert_array_equal(answer[name].astype(np.float32), value.astype(np.float32))
    np.testing.assert_array_equal(expected["same"], x)  # and the reference is not vacuous


def test_bf16_metadata_says_bf16(server):
    with client(server) as triton:
        metadata = triton.get_model_metadata("bf16")
    assert metadata["inputs"] == [{"name": "x", "datatype": "BF16", "shape": [-1, 2]}]
    assert [o["datatype"] for o in metadata["outputs"]] == ["FP32", "BF16", "BF16"]


# -- tabular models -------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["gb", "lr", "xgb", "lgbm"])
def test_breast_cancer_one_row_a_request_answers_as_alone(server, sessions, model, protocol):
    rows = plain_graphs.breast_cancer_rows()[RNG.choice(569, size=64, replace=False)]

    def send(row: np.ndarray):
        names = ["output_label", "output_probability"]
        result = client_infer(server, protocol, model, {"X": row[None]}, names)
        return result["output_label"], result["output_probability"]

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(send, rows))
    for row, (label, probability) in zip(rows, answers, strict=True):
        expected = alone(sessions[model], {"X": row[None]})
        np.testing.assert_array_equal(label, expected["output_label"])
        assert probability.shape == (1, 2)
        # A batched matrix product may round the last bit of float32 differently.
        np.testing.assert_allclose(probability, expected["output_probability"], atol=1e-6)


@pytest.mark.parametrize("model", ["gb", "xgb", "lgbm"])
@pytest.mark.parametrize("form", ["records", "tensors"])
def test_predict_takes_records_and_named_tensors(server, sessions, form, model):
    rows = plain_graphs.breast_cancer_rows()[:5]
    inputs = [{"X": row.tolist()} for row in rows] if form == "records" else {"X": rows.tolist()}
    reply = httpx.post(f"{server.url}/predict", json={"model": model, "inputs": inputs}, timeout=30)
    assert reply.status_code == 200, reply.text
    answers = reply.json()["outputs"]
    expected = alone(sessions[model], {"X": rows})
    assert [a["output_label"] for a in answers] == expected["output_label"].tolist()
    for answer, probability in zip(answers, expected["output_probability"], strict=True):
        assert list(answer["output_probability"]) == ["0", "1"]  # ZipMap's classes as keys
        np.testing.assert_allclose(list(answer["output_probability"].values()), probability)


def test_zipmap_classes_learned_from_the_first_answer_key_it(server, sessions):
    """A string input: no warm-up taught the classes, the first request's answer does (and,
    with API processes, the engine tells them before that answer)."""
    colours = np.array([["red"], ["blue"]], dtype=object)
    body = {"model": "colour", "inputs": [{"colour": "red"}, {"colour": "blue"}]}
    reply = httpx.post(f"{server.url}/predict", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    expected = alone(sessions["colour"], {"colour": colours})
    answers = reply.json()["outputs"]
    for answer, probability in zip(answers, expected["output_probability"], strict=True):
        assert list(answer["output_probability"]) == ["0", "1"]
        np.testing.assert_allclose(list(answer["output_probability"].values()), probability)
    with client(server) as triton:
        output = triton.get_model_metadata("colour")["outputs"][1]
    assert output["shape"] == [-1, 2] and output["parameters"] == {"classes": ["0", "1"]}


def test_predict_serves_text_and_plain_graphs_side_by_side(server):
    text = httpx.post(f"{server.url}/predict", json={"inputs": "a sentence"}, timeout=30)
    assert text.status_code == 200 and text.json()["model"] == DEFAULT_MODEL
    row = plain_graphs.breast_cancer_rows()[0].tolist()
    body = {"model": "lr", "inputs": [{"X": row}]}
    tabular = httpx.post(f"{server.url}/predict", json=body, timeout=30)
    assert tabular.status_code == 200, tabular.text
    (answer,) = tabular.json()["outputs"]
    assert list(answer) == ["output_probability"]  # the configured outputs, not every one
    listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    assert {m["id"] for m in listed} >= {DEFAULT_MODEL, "masked", "lr", "logreg_iris"}


@pytest.mark.parametrize("protocol", ["predict", "json", "http"])
def test_string_labels_come_back_as_strings(server, sessions, protocol):
    rows = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
    expected = alone(sessions["iris_by_name"], {"X": rows})
    if protocol == "predict":
        body = {"model": "iris_by_name", "inputs": {"X": rows.tolist()}}
        reply = httpx.post(f"{server.url}/predict", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        answers = reply.json()["outputs"]
        assert [a["output_label"] for a in answers] == expected["output_label"].tolist()
        assert list(answers[1]["output_probability"]) == list(plain_graphs.IRIS_NAMES)
        return
    if protocol == "json":
        reply = infer(server, "iris_by_name", [kserve_input("X", rows)])
        assert reply.status_code == 200, reply.text
        label = reply.json()["outputs"][0]
        assert label["datatype"] == "BYTES" and label["data"] == expected["output_label"].tolist()
        return
    result = client_infer(server, "http", "iris_by_name", {"X": rows}, ["output_label"])
    assert [b.decode() for b in result["output_label"]] == expected["output_label"].tolist()


def test_a_fixed_first_axis_is_served_one_request_at_a_time(server, sessions):
    requests = [RNG.normal(size=(3, 2)).astype(np.float32) for _ in range(12)]

    def send(x: np.ndarray) -> dict:
        reply = infer(server, "logreg_iris", [kserve_input("float_input", x)])
        assert reply.status_code == 200, reply.text
        return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in reply.json()["outputs"]}

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(send, requests))
    for x, answer in zip(requests, answers, strict=True):
        expected = alone(sessions["iris"], {"float_input": x})
        np.testing.assert_array_equal(answer["label"], expected["label"])
        np.testing.assert_allclose(answer["probabilities"], expected["probabilities"], rtol=1e-6)


# -- requests larger than a batch ----------------------------------------------------------------


def chunked_request(model: str, rows: int) -> dict[str, np.ndarray]:
    if model == "gb_chunked":
        return {"X": plain_graphs.breast_cancer_rows()[RNG.choice(569, size=rows, replace=False)]}
    return masked_request(rows)


@pytest.mark.parametrize("protocol", ["http", "grpc", "predict"])
@pytest.mark.parametrize("model", ["gb_chunked", "masked_chunked"])
def test_a_request_larger_than_a_batch_goes_in_chunks_and_answers_as_alone(
    server, sessions, model, protocol
):
    feeds = chunked_request(model, rows=3 * 3 + 2)  # four chunks, the last of two rows
    session = sessions[model.removesuffix("_chunked")]
    expected = alone(session, feeds)
    outputs = [o.name for o in session.get_outputs()]
    metrics = ("ferry_batch_size_requests_count", "ferry_batch_size_requests_sum")
    before = [metric_value(server.metrics(), m, model=model) for m in metrics]
    if protocol == "predict":
        body = {"model": model, "inputs": {n: a.tolist() for n, a in feeds.items()}}
        reply = httpx.post(f"{server.url}/predict", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        rows = reply.json()["outputs"]
        answer = {n: np.array([_values(row[n]) for row in rows]) for n in outputs}
    else:
        answer = client_infer(server, protocol, model, feeds, outputs)
    for name in outputs:
        assert answer[name].shape == expected[name].shape, name
        np.testing.assert_allclose(answer[name], expected[name], rtol=1e-6, atol=1e-6)
    text = server.metrics()
    batches, members = (
        metric_value(text, m, model=model) - b for m, b in zip(metrics, before, strict=True)
    )
    # Chunks of 3, 3, 3 and 2 rows, each a queue member; 3 rows a batch at most: one a batch.
    assert (batches, members) == (4, 4), "the request ran whole, or chunks shared a batch"


def _values(value):
    """A /predict answer's value: a ZipMap row's {class: p} as its probabilities."""
    return list(value.values()) if isinstance(value, dict) else value


@pytest.mark.parametrize("rows", [3 * 8 + 1, 3 * 4 + 1])
def test_a_request_more_chunks_than_half_the_queue_is_a_4xx_naming_the_input(server, rows):
    """More chunks than the queue holds can never run; more than half of it (issue 48) would
    leave other clients only 429s while it drains."""
    feeds = chunked_request("gb_chunked", rows=rows)
    reply = infer(server, "gb_chunked", [kserve_input("X", feeds["X"])])
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"].startswith(
        f"X: {rows} rows go in chunks of 3, more than the 4 places one request may take of the "
        "queue's 8 (at most 12 rows)"
    )
    assert infer(server, "gb_chunked", [kserve_input("X", feeds["X"][:12])]).status_code == 200


# -- classification (Triton's extension) ---------------------------------------------------------

IRIS_ROWS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]], np.float32)
CLASSIFIED = [
    # (model, its feeds, the output, k, its labels (ZipMap's classes), top k of each row?)
    ("gb", {"X": plain_graphs.breast_cancer_rows()[:4]}, "output_probability", 1, ["0", "1"], True),
    # Labels from the model's config.
    (
        "lr",
        {"X": plain_graphs.breast_cancer_rows()[:4]},
        "output_probability",
        2,
        BREAST_CANCER_LABELS,
        True,
    ),
    (
        "lgbm",
        {"X": plain_graphs.breast_cancer_rows()[4:9]},
        "output_probability",
        2,
        ["0", "1"],
        True,
    ),
    (
        "iris_by_name",
        {"X": IRIS_ROWS},
        "output_probability",
        2,
        list(plain_graphs.IRIS_NAMES),
        True,
    ),
    # A fixed first axis: a ZipMap still by row; a tensor's top k of all of it, [k], as Triton.
    ("logreg_iris", {"float_input": IRIS_ROWS[:, :2]}, "probabilities", 2, ["0", "1", "2"], True),
    ("logreg_iris", {"float_input": IRIS_ROWS[:, :2]}, "label", 2, None, False),
]


def top_classes(scores: np.ndarray, k: int, labels: list[str] | None, batched: bool) -> list:
    """(value, index, label) of the k highest scores of each row, ties to the lower index."""
    rows = scores.reshape(len(scores), -1) if batched else scores.reshape(1, -1)
    return [
        [
            (row[i], i, labels[i] if labels else None)
            for i in sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
        ]
        for row in rows
    ]


def read_classes(strings: np.ndarray) -> list:
    """Triton's "value:index[:label]" strings, [N, k] (or [k]), read back."""
    rows = strings if strings.ndim == 2 else strings[None]
    answers = []
    for row in rows:
        fields = [item.decode().split(":", 2) for item in row]
        answers.append([(float(f[0]), int(f[1]), f[2] if len(f) > 2 else None) for f in fields])
    return answers


@pytest.mark.parametrize("protocol", ["http", "grpc", "json"])
@pytest.mark.parametrize(("model", "feeds", "output", "k", "labels", "batched"), CLASSIFIED)
def test_classification_gives_the_top_k_with_labels(
    server, sessions, protocol, model, feeds, output, k, labels, batched
):
    if protocol == "json":  # strings in a JSON reply
        inputs = [kserve_input(n, a) for n, a in feeds.items()]
        body = {
            "inputs": inputs,
            "outputs": [{"name": output, "parameters": {"classification": k}}],
        }
        reply = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        (entry,) = reply.json()["outputs"]
        assert entry["datatype"] == "BYTES"
        answer = np.array([s.encode() for s in entry["data"]], object).reshape(entry["shape"])
    else:
        answer = client_infer(server, protocol, model, feeds, [output], class_count=k)[output]
    session = sessions["iris" if model == "logreg_iris" else model]
    expected = top_classes(alone(session, feeds)[output], k, labels, batched)
    assert answer.dtype == object and answer.shape == ((len(expected), k) if batched else (k,))
    for got, want in zip(read_classes(answer), expected, strict=True):
        assert [(i, label) for _, i, label in got] == [(i, label) for _, i, label in want]
        np.testing.assert_allclose([v for v, _, _ in got], [v for v, _, _ in want], atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classification_of_a_text_encoder_output(server, protocol):
    texts = np.array([[b"a sentence"], [b"another one, longer"]], dtype=object)
    feeds, output = {"text": texts}, "sentence_embedding"
    plain = client_infer(server, protocol, DEFAULT_MODEL, feeds, [output])[output]
    answer = client_infer(server, protocol, DEFAULT_MODEL, feeds, [output], class_count=3)
    for got, want in zip(
        read_classes(answer[output]), top_classes(plain, 3, None, True), strict=True
    ):
        assert [i for _, i, _ in got] == [i for _, i, _ in want]


BAD_CLASSIFICATION = [
    # (model, output, the parameter, words of the message)
    ("gb", "output_probability", 3, "more than the output's 2 classes"),
    ("gb", "output_probability", 0, "positive integer"),
    ("gb", "output_probability", "2", "positive integer"),
    ("gb", "output_probability", True, "positive integer"),
    ("iris_by_name", "output_label", 1, "this output is BYTES"),
]


@pytest.mark.parametrize(("model", "output", "count", "words"), BAD_CLASSIFICATION)
def test_a_classification_that_cannot_be_given_is_a_4xx_naming_the_output(
    server, model, output, count, words
):
    body = {
        "inputs": [
            kserve_input(
                "X", plain_graphs.breast_cancer_rows()[:1] if model == "gb" else IRIS_ROWS[:1]
            )
        ],
        "outputs": [{"name": output, "parameters": {"classification": count}}],
    }
    reply = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)
    assert 400 <= reply.status_code < 500, reply.text
    message = reply.json()["error"]
    assert message.startswith(f"{output}:") and words in message, message


def test_the_server_lists_the_classification_extension(server):
    with client(server) as triton:
        assert "classification" in triton.get_server_metadata()["extensions"]
    with client(server, "grpc") as triton:
        assert "classification" in triton.get_server_metadata(as_json=True)["extensions"]


# -- starting -------------------------------------------------------------------------------------


def test_a_missing_model_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "model.onnx"
    run = subprocess.run(
        [sys.executable, "-m", "ferry", "serve", "--model", f"m={missing}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert str(missing) in run.stderr


@pytest.mark.parametrize(
    ("graph", "fields", "words"),
    [
        ("masked", {"pad_values": {"nope": 1.0}}, "pad_values names ['nope']"),
        ("masked", {"pad_axes": ["N", "S"]}, "pad_axes names ['N', 'S']"),
        ("masked", {"outputs": ["mean", "median"]}, "outputs ['median']"),
        # An unnamed axis ties no output to it: its padding could not be cut back.
        ("unnamed", {"pad_axes": ["data:1"]}, "pad_axes names ['data:1']"),
        ("gb", {"labels": {"nope": ["a"]}}, "labels names 'nope'"),
        ("gb", {"labels": {"output_probability": ["a", "b", "c"]}}, "3 labels for output"),
    ],
)
async def test_settings_a_graph_cannot_honour_stop_its_start(graphs, graph, fields, words):
    settings = ModelSettings(name="m", path=graphs[graph], **fields)
    model = GraphRuntime(settings, graphs[graph], FerryMetrics(CollectorRegistry()))
    try:
        with pytest.raises(ValueError, match=re.escape(words)):
            await model.start()
    finally:
        await model.close(0)
