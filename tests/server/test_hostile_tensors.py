"""No input is a 5xx on the tensor routes: plain graphs, an image model and the default encoder
served by a real `ferry serve`, sent hostile tensors on /predict, KServe JSON, KServe binary and
gRPC. Each refusal is a 4xx naming the field, decided before any heavy work; then a fuzzer
sends near-valid bodies to every route and fails on any 5xx."""

from __future__ import annotations

import base64
import json
import math
import struct

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.bench.processes import free_port
from ferry.bench.server_process import DEFAULT_MODEL, default_model_config, ferry_server
from tests.server.conftest import IN_PROCESS
from tests.support import images, plain_graphs

pytestmark = pytest.mark.integration

HEADER_LENGTH = "inference-header-content-length"
GRAPHS = ("masked", "every_type", "cnn")


# Refused before the hop (signatures are checked in the API process); tensors crossing it:
# test_tensor_model.py.
@pytest.fixture(scope="module", params=IN_PROCESS)
def server(tmp_path_factory, request):
    folder = tmp_path_factory.mktemp("hostile")
    masked = plain_graphs.masked_mean(folder / "masked.onnx")
    every_type = plain_graphs.every_type(folder / "every_type.onnx")
    cnn = images.tiny_cnn(folder / "cnn.onnx")  # its preprocessing in the graph's metadata
    args = ["--model", f"masked={masked}", "--model", f"every_type={every_type}"]
    args += ["--model", f"cnn={cnn}"]
    grpc_port = free_port()
    options = {"grpc_port": grpc_port, "api_servers": request.param}
    with ferry_server([default_model_config()], options, args=args) as handle:
        handle.grpc_url = f"127.0.0.1:{grpc_port}"
        yield handle


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def nested(levels: int) -> list:
    data: list = [1.0]
    for _ in range(levels - 1):
        data = [data]
    return data


def tensor(name: str, shape: list, datatype: str, data=None, **parameters) -> dict:
    entry = {"name": name, "shape": shape, "datatype": datatype}
    if data is not None:
        entry["data"] = data
    if parameters:
        entry["parameters"] = parameters
    return entry


MASK = tensor("mask", [1, 2], "INT64", [1, 1])
DATA = tensor("data", [1, 2], "FP32", [0.5, 1.5])
# Strings of unequal lengths for FP32 (~80 KB): numpy's inference made them ~950 MB.
UNEQUAL = ["a" * 40_000] + [""] * 13_000
BOMBS = {  # PNG headers claiming sides their few bytes never hold, and a long thin real one
    "1x40M": images.png_header(1, 40_000_000),
    "39Mx1": images.png_header(39_000_000, 1),
    "1x39M": images.png_header(1, 39_000_000),
    "thin": images.blank_png(100, 6_401),
}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def binary_body(header: dict, tail: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + tail, {HEADER_LENGTH: str(len(head)), "content-type": "application/octet-stream"}


def send(client: httpx.Client, route: str, model: str, body) -> httpx.Response:
    """`route`: predict (JSON), raw (an image body), kserve (JSON) or kserve-binary (`body` a
    header and the binary tail)."""
    if route == "predict":
        return client.post("/predict", json={"model": model, **body})
    if route == "raw":
        headers = {"content-type": "image/png"}
        return client.post(f"/predict?model={model}", content=body, headers=headers)
    path = f"/v2/models/{model}/infer"
    if route == "kserve":
        return client.post(path, json=body)
    content, headers = binary_body(*body)
    return client.post(path, content=content, headers=headers)


def refused_field(answer: httpx.Response, route: str) -> tuple[str, str]:
    """The field a 4xx names and its message, in the route's dialect."""
    assert 400 <= answer.status_code < 500, answer.text[:300]
    error = answer.json()["error"]
    if route.startswith("kserve"):
        field, _, message = error.partition(": ")
        return field, message
    return error["param"], error["message"]


def image_binary(data: bytes) -> tuple[dict, bytes]:
    blob = struct.pack("<I", len(data)) + data
    entry = tensor("pixel_values", [1], "BYTES", binary_data_size=len(blob))
    return {"inputs": [entry]}, blob


def shape_binary(name: str, shape: list, datatype: str, size: int) -> tuple[dict, bytes]:
    return {"inputs": [tensor(name, shape, datatype, binary_data_size=size)]}, b"\0" * size


def with_size(size, name: str = "data", datatype: str = "FP32") -> tuple[dict, bytes]:
    """An input whose binary_data_size is `size` (a JSON value), 8 bytes of data after."""
    return {"inputs": [tensor(name, [1, 2], datatype, binary_data_size=size)]}, b"\0" * 16


CASES = [
    # 1. Nesting deeper than a tensor's axes (numpy raised past 64).
    ("predict", "masked", {"inputs": {"data": nested(65), "mask": [[1]]}}, "data", "nested"),
    ("predict", "masked", {"inputs": {"data": nested(33), "mask": [[1]]}}, "data", "nested"),
    ("predict", "masked", {"inputs": [{"data": nested(70), "mask": 1}]}, "data", "nested"),
    ("kserve", "masked", {"inputs": [tensor("data", [1], "FP32", nested(65))]}, "data", "nested"),
    ("kserve", "masked", {"inputs": [tensor("data", [1] * 70, "FP32", [1.0])]}, "data", "70 dim"),
    # 2. Image bombs, every way an image arrives over HTTP.
    *(("raw", "cnn", data, "pixel_values", "the image is") for data in BOMBS.values()),
    *(
        ("predict", "cnn", {"inputs": {"pixel_values": [b64(d)]}}, "pixel_values[0]", "image")
        for d in BOMBS.values()
    ),
    *(
        ("kserve-binary", "cnn", image_binary(data), "pixel_values[0]", "the image is")
        for data in BOMBS.values()
    ),
    # 3. binary_data_size other than a count of bytes.
    *(
        ("kserve-binary", model, with_size(size, name, datatype), name, "binary_data_size")
        for size in ("8", "abc", [8], -4, 8.5, True, {"n": 8})
        for model, name, datatype in (
            ("masked", "data", "FP32"),
            (DEFAULT_MODEL, "input_ids", "INT64"),
            (DEFAULT_MODEL, "text", "BYTES"),
        )
    ),
    # 4. Shapes no data could fill, negative ones, and numpy's impossible ones.
    *(
        (
            "kserve",
            model,
            {"inputs": [tensor(name, shape, datatype, [1])]},
            name,
            f"shape {shape}",
        )
        for shape in ([700001, 500000], [-1, 1], [2, -1], [2**63, 0], [2**62, 2**62, 0])
        for model, name, datatype in (
            ("masked", "data", "FP32"),
            (DEFAULT_MODEL, "input_ids", "INT64"),
        )
    ),
    ("kserve-binary", "masked", shape_binary("data", [700001, 500000], "FP32", 8), "data", "shape"),
    ("kserve-binary", "cnn", shape_binary("pixel_values", [-4], "BYTES", 8), "pixel_values", "neg"),
    # 5. Strings where numbers go.
    ("predict", "masked", {"inputs": {"data": [UNEQUAL], "mask": [[1]]}}, "data[0]", "numbers"),
    (
        "kserve",
        "masked",
        {"inputs": [tensor("data", [1, 13001], "FP32", UNEQUAL)]},
        "data[0]",
        "numbers",
    ),
    # 6. An output asked for more than once.
    *(
        (route, model, body, "outputs", "more than once")
        for route, model, body in (
            (
                "predict",
                "masked",
                {"inputs": {"data": [[0.5]], "mask": [[1]]}, "outputs": ["mean"] * 50_000},
            ),
            (
                "predict",
                DEFAULT_MODEL,
                {"input_ids": [101, 102], "outputs": ["sentence_embedding"] * 2},
            ),
            ("kserve", "masked", {"inputs": [DATA, MASK], "outputs": [{"name": "mean"}] * 50_000}),
            (
                "kserve",
                DEFAULT_MODEL,
                {
                    "inputs": [tensor("input_ids", [1, 2], "INT64", [101, 102])],
                    "outputs": [{"name": "sentence_embedding"}] * 2,
                },
            ),
        )
    ),
]


@pytest.mark.parametrize(
    ("route", "model", "body", "field", "says"),
    CASES,
    ids=[
        f"{route}-{model}-{field}-{index}"
        for index, (route, model, _, field, _) in enumerate(CASES)
    ],
)
def test_hostile_tensors_are_a_4xx_naming_the_field(client, route, model, body, field, says):
    if route == "predict" and model == DEFAULT_MODEL:  # the encoder's body: no model needed
        answer = client.post("/predict", json=body)
    else:
        answer = send(client, route, model, body)
    named, message = refused_field(answer, route)
    assert named == field and says in message, (named, message)


def grpc_infer(server, request: service_pb2.ModelInferRequest) -> grpc.RpcError:
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as error:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    return error.value


@pytest.mark.parametrize(
    ("model", "name", "datatype", "field"),
    [
        ("masked", "data", "FP32", "fp32_contents"),
        (DEFAULT_MODEL, "input_ids", "INT64", "int64_contents"),
    ],
)
@pytest.mark.parametrize("shape", [[-1, -2], [-1, 2], [2**62, 2**62, 0], [1] * 40])
def test_grpc_refuses_impossible_shapes_naming_the_input(
    server, model, name, datatype, field, shape
):
    request = service_pb2.ModelInferRequest(model_name=model)
    entry = request.inputs.add(name=name, datatype=datatype, shape=shape)
    getattr(entry.contents, field).extend([1, 2])
    error = grpc_infer(server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert error.details().startswith(f"{name}: shape"), error.details()


def test_grpc_refuses_an_output_asked_for_twice(server):
    request = service_pb2.ModelInferRequest(model_name="masked")
    for name, datatype, values in (("data", "FP32", [0.5]), ("mask", "INT64", [1])):
        entry = request.inputs.add(name=name, datatype=datatype, shape=[1, 1])
        contents = (
            entry.contents.fp32_contents if datatype == "FP32" else entry.contents.int64_contents
        )
        contents.extend(values)
    request.outputs.add(name="mean")
    request.outputs.add(name="mean")
    error = grpc_infer(server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(
        "outputs: output 'mean' already exists in request: asked for more than once"
    )


# -- the fuzzer --------------------------------------------------------------------------------
# Bodies near a valid request of each model: every input (now and then one missing or another
# added), mostly of its own datatype and shape with items mostly of its kind, each part now and
# then wild. Fully random JSON rarely gets past "not an input of this model".

MODELS = {  # inputs: datatype and axes after the rows ("T": a width shared by the inputs)
    "masked": {"data": ("FP32", ("T",)), "mask": ("INT64", ("T",))},
    "every_type": {f"x_{t}": (t, (2,)) for t in plain_graphs.EVERY_TYPE},
    "cnn": {"pixel_values": ("FP32", (3, images.SIZE, images.SIZE))},
}
OUTPUTS = {
    "masked": ["mean", "masked"],
    "every_type": [f"y_{t}" for t in plain_graphs.EVERY_TYPE],
    "cnn": ["logits"],
}
NAMES = st.sampled_from(["data", "mask", "x_FP32", "y_FP32", "pixel_values", "logits", "nope"])
DATATYPES = st.sampled_from([*plain_graphs.EVERY_TYPE, "BYTES", "BF16", "FP8", ""])
# Small ones: an image tensor's one value is repeated thousands of times.
IMAGES = st.sampled_from([images.encoded(2, "PNG"), images.encoded(3), BOMBS["1x40M"], b"%%%"])
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
)
VALUES = st.recursive(
    LEAVES | IMAGES.map(b64),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["name", "data", "shape"]), children, max_size=2)
    ),
    max_leaves=16,
)
WILD_DATA = VALUES | st.builds(nested, st.integers(30, 70)) | st.just(UNEQUAL)
SHAPES = st.lists(st.integers(-2, 4) | st.sampled_from([2**31, 2**63 - 1, 700_001]), max_size=5)
SIZES = st.integers(-2, 40) | LEAVES | st.lists(st.integers(0, 8), max_size=2)


def items_of(datatype: str) -> st.SearchStrategy:
    """JSON items of `datatype`'s kind, three times in four; any JSON item else."""
    if datatype == "BOOL":
        kind = st.booleans()
    elif datatype.startswith("FP"):
        kind = st.floats(-70_000, 70_000) | st.integers(-3, 3)
    else:
        kind = st.integers(-(2**64), 2**64) | st.integers(-3, 300)
    return st.one_of(kind, kind, kind, LEAVES)


def rows_of(flat: list, shape: list[int]) -> list:
    """`flat` nested in `shape` (the first axis outermost)."""
    for size in reversed(shape[1:]):
        flat = [flat[i : i + size] for i in range(0, len(flat), size)]
    return flat


def blob(datatype: str, items: list) -> bytes:
    """Triton's binary tensor data of `items`' count: zeros of a number's size (a wrong kind's
    size is wrong, and refused), or each item length-prefixed for BYTES."""
    if datatype == "BYTES":
        raw = [item if isinstance(item, bytes) else str(item).encode() for item in items]
        return b"".join(struct.pack("<I", len(item)) + item for item in raw)
    bits = "".join(filter(str.isdigit, datatype))
    return bytes(len(items) * (int(bits) // 8 if bits else 1))


@st.composite
def near_valid(draw, model: str, binary: bool = False) -> tuple[dict[str, list], dict, bytes]:
    """(each input's nested data for /predict, the KServe body, its binary tail)."""
    rows, width = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    tensors, entries, tail = {}, [], b""
    for name, (datatype, axes) in MODELS[model].items():
        if draw(st.integers(0, 11)) == 0:
            continue  # a required input missing
        shape = [rows, *(width if axis == "T" else axis for axis in axes)]
        if name == "pixel_values" and draw(st.booleans()):  # encoded images
            datatype, shape = "BYTES", [rows]
            items: list = draw(st.lists(IMAGES, min_size=rows, max_size=rows))
            data: list = [b64(item) for item in items]
        elif len(shape) > 2:  # an image tensor: one value throughout
            items = data = [draw(items_of(datatype))] * math.prod(shape)
        else:
            count = math.prod(shape)
            items = data = draw(st.lists(items_of(datatype), min_size=count, max_size=count))
        entry = {"name": name, "datatype": datatype, "shape": shape}
        wild = draw(st.sampled_from([None, None, None, "datatype", "shape", "data"]))
        if wild == "datatype":
            entry["datatype"] = draw(DATATYPES)
        elif wild == "shape":
            entry["shape"] = draw(SHAPES)
        elif wild == "data":
            data = draw(WILD_DATA)
        if binary and draw(st.integers(0, 3)):
            chunk = blob(datatype, items)
            size = draw(SIZES) if wild == "data" else len(chunk)
            entry["parameters"] = {"binary_data_size": size}
            tail += chunk
        else:
            entry["data"] = data
        entries.append(entry)
        tensors[name] = data if wild == "data" or datatype == "BYTES" else rows_of(data, shape)
    if draw(st.integers(0, 7)) == 0:  # an input more, of any shape
        entry = {"name": draw(NAMES), "shape": draw(SHAPES), "datatype": draw(DATATYPES)}
        entries.append({**entry, "data": draw(WILD_DATA)})
    asked = draw(st.lists(st.sampled_from([*OUTPUTS[model], "nope"]), max_size=3))
    body: dict = {"inputs": entries}
    if asked:
        body["outputs"] = [{"name": name} for name in asked]
    if draw(st.integers(0, 5)) == 0:
        priority = draw(st.integers(0, 3) | LEAVES)
        body["parameters"] = {"binary_data_output": draw(LEAVES), "priority": priority}
    return tensors, body, tail


FUZZ = settings(
    # Per fuzzer and process mode: 360 bodies a run in all, and each fresh clone draws new ones.
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def post_json(client: httpx.Client, path: str, body) -> httpx.Response:
    # ensure_ascii: lone surrogates travel as escapes; NaN and Infinity as Python writes them.
    content = json.dumps(body, ensure_ascii=True).encode()
    return client.post(path, content=content, headers={"content-type": "application/json"})


def assert_no_5xx(answer: httpx.Response, body) -> None:
    assert answer.status_code < 500, (answer.status_code, answer.text[:300], repr(body)[:500])


@FUZZ
@given(model=st.sampled_from(GRAPHS), data=st.data())
def test_predict_fuzz_is_never_a_5xx(client, model, data):
    tensors, kserve, _ = data.draw(near_valid(model))
    inputs: dict | list = tensors
    if data.draw(st.integers(0, 3)) == 0:  # as records: one object per row
        rows = max((len(v) for v in tensors.values() if isinstance(v, list)), default=0)
        inputs = [
            {k: v[i] for k, v in tensors.items() if isinstance(v, list) and i < len(v)}
            for i in range(rows)
        ]
    body = {"model": model, "inputs": inputs}
    if "outputs" in kserve:
        body["outputs"] = [entry["name"] for entry in kserve["outputs"]]
    answer = post_json(client, "/predict", body)
    assert_no_5xx(answer, body)


@FUZZ
@given(model=st.sampled_from(GRAPHS), data=st.data())
def test_kserve_json_fuzz_is_never_a_5xx(client, model, data):
    _, body, _ = data.draw(near_valid(model))
    answer = post_json(client, f"/v2/models/{model}/infer", body)
    assert_no_5xx(answer, body)


@FUZZ
@given(model=st.sampled_from(GRAPHS), data=st.data(), extra=st.binary(max_size=8))
def test_kserve_binary_fuzz_is_never_a_5xx(client, model, data, extra):
    _, body, tail = data.draw(near_valid(model, binary=True))
    content, headers = binary_body(body, tail + extra)
    answer = client.post(f"/v2/models/{model}/infer", content=content, headers=headers)
    assert_no_5xx(answer, (body, len(tail)))


def test_the_server_still_answers_after_the_fuzzers(client):
    answer = client.post("/v2/models/masked/infer", json={"inputs": [DATA, MASK]})
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["outputs"][0]["data"] == [1.0]
