"""A user's own token models, served as exported: the usual 3-input BERT export (with
token_type_ids), int32 ids, TensorFlow's input names; no Ferry manifest, only the HF config.
Every answer is checked against onnxruntime run on the request alone."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from ferry.bench.server_process import default_model_config, ferry_server
from tests.exporters.tiny_bert import HF_NAMES, TF_NAMES, build_tiny_bert, export_three_inputs
from tests.server.conftest import API_SERVERS

pytestmark = pytest.mark.integration

EXPORTS = {"bert64": (HF_NAMES, "int64"), "bert32": (TF_NAMES, "int32")}
RNG = np.random.default_rng(3)


@pytest.fixture(scope="module")
def exports(default_model_dir, tmp_path_factory):
    bert = build_tiny_bert(3, default_model_dir, tmp_path_factory.mktemp("hf"))
    return {
        name: export_three_inputs(bert, tmp_path_factory.mktemp(name), names, dtype)
        for name, (names, dtype) in EXPORTS.items()
    }


@pytest.fixture(scope="module", params=API_SERVERS)
def server(request, exports):
    models = [
        default_model_config(name=name, path=str(path), outputs=["logits"])
        for name, path in exports.items()
    ]
    with ferry_server(
        [*models, default_model_config(batching={"max_queue_delay_s": 0.005})],
        server={"api_servers": request.param},
    ) as handle:
        yield handle


def run_alone(export, ids, types) -> np.ndarray:
    """The graph on this one row, fed as it declares (names and dtypes)."""
    session = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    dtype = np.int32 if inputs[0].type == "tensor(int32)" else np.int64
    values = (ids, np.ones(len(ids)), types)
    feeds = {i.name: np.asarray([v], dtype=dtype) for i, v in zip(inputs, values, strict=True)}
    return session.run(["logits"], feeds)[0][0]


def pair_row(length: int) -> tuple[list[int], list[int]]:
    ids = [101, *RNG.integers(2000, 29000, size=length - 2).tolist(), 102]
    cut = length // 2
    return ids, [0] * cut + [1] * (length - cut)


async def post_all(url: str, path: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(*(client.post(path, json=b) for b in bodies))


@pytest.mark.parametrize("name", list(EXPORTS))
def test_predict_with_segment_ids_equals_each_row_alone(server, exports, name):
    rows = [pair_row(int(n)) for n in RNG.integers(4, 100, size=24)]
    bodies = [{"model": name, "input_ids": ids, "token_type_ids": types} for ids, types in rows]
    responses = asyncio.run(post_all(server.url, "/predict", bodies))
    assert [r.status_code for r in responses] == [200] * len(rows), responses[0].text
    for (ids, types), response in zip(rows, responses, strict=True):
        got = np.asarray(response.json()["outputs"][0]["logits"])
        assert np.max(np.abs(got - run_alone(exports[name], ids, types))) <= 1e-4


@pytest.mark.parametrize("name", list(EXPORTS))
def test_text_without_segment_ids_is_sentence_a(server, exports, name):
    response = httpx.post(
        f"{server.url}/predict",
        json={"model": name, "inputs": "the ferry sails at noon", "outputs": ["logits", "label"]},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    ids = httpx.post(
        f"{server.url}/tokenize", json={"model": name, "prompt": "the ferry sails at noon"}
    ).json()["tokens"]
    want = run_alone(exports[name], ids, [0] * len(ids))
    item = response.json()["outputs"][0]
    assert np.max(np.abs(np.asarray(item["logits"]) - want)) <= 1e-4
    assert item["label"] == f"LABEL_{int(np.argmax(want))}"


@pytest.mark.parametrize("datatype", ["INT64", "INT32"])
@pytest.mark.parametrize("name", list(EXPORTS))
def test_kserve_padded_pairs_equal_each_row_alone(server, exports, name, datatype):
    rows = [pair_row(n) for n in (5, 17, 9)]
    width = max(len(ids) for ids, _ in rows)
    ids, mask, types = (np.zeros((len(rows), width), dtype=np.int64) for _ in range(3))
    for i, (row_ids, row_types) in enumerate(rows):
        ids[i, : len(row_ids)], mask[i, : len(row_ids)] = row_ids, 1
        types[i, : len(row_ids)] = row_types
    tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    body = {
        "inputs": [
            {"name": n, "datatype": datatype, "shape": list(v.shape), "data": v.ravel().tolist()}
            for n, v in tensors.items()
        ]
    }
    response = httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    logits = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    for row, (row_ids, row_types) in enumerate(rows):
        assert np.max(np.abs(logits[row] - run_alone(exports[name], row_ids, row_types))) <= 1e-4
    metadata = httpx.get(f"{server.url}/v2/models/{name}").json()
    assert "token_type_ids" in {i["name"] for i in metadata["inputs"]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_ids": [101, 7, 102], "token_type_ids": [0, 2, 1]}, "token_type_ids"),
        ({"input_ids": [101, 7, 102], "token_type_ids": [0, 1]}, "token_type_ids"),
        ({"input_ids": [[101, 102], [101, 7, 102]], "token_type_ids": [[0, 0]]}, "token_type_ids"),
        (
            {"input_ids": [[101, 102], [101, 7, 102]], "token_type_ids": [[0, 0], [0, 1]]},
            "token_type_ids[1]",
        ),
        ({"input_ids": [101, 102], "token_type_ids": [0, "1"]}, "token_type_ids[1]"),
        ({"inputs": "text", "token_type_ids": [0]}, "token_type_ids"),
        # The default model's graph reads no segment ids: ones cannot be honoured.
        (
            {"model": "all-MiniLM-L6-v2", "input_ids": [101, 102], "token_type_ids": [0, 1]},
            "token_type_ids",
        ),
    ],
)
def test_wrong_segment_ids_are_a_422_naming_them(server, body, field):
    response = httpx.post(f"{server.url}/predict", json={"model": "bert32", **body}, timeout=30)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    # A field of the body's shape is named in the message (pydantic's), a value in `param`.
    assert error["param"] == field if error["param"] else f"'{field}'" in error["message"]


def test_kserve_segment_ids_of_another_shape_are_a_400(server):
    ids = {"name": "input_ids", "datatype": "INT32", "shape": [1, 3], "data": [101, 7, 102]}
    types = {"name": "token_type_ids", "datatype": "INT32", "shape": [1, 2], "data": [0, 1]}
    response = httpx.post(
        f"{server.url}/v2/models/bert32/infer", json={"inputs": [ids, types]}, timeout=30
    )
    assert response.status_code == 400 and "token_type_ids" in response.text
