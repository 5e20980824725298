"""Issue 48: graphs that break naive batching (tests/support/batching_corpus.py), served with the
default configuration under 16 concurrent clients with mixed shapes: every answer must equal
ONNX Runtime run on that request alone, and /config must say which rule each axis follows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton_http

from ferry.bench.server_process import default_model_config, ferry_server
from tests.server.conftest import API_SERVERS
from tests.support.batching_corpus import CORPUS, build_corpus
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

CLIENTS = 16
REQUESTS = 48
# Served whole, one request at a time: their answers depend on what else is in a batch.
ALONE = {"gru_seq_first": "names axis 1 ('batch') as its batch", "int8_mlp": "DynamicQuantize"}
EXACT = {"identity_fp32", "identity_bytes"}  # nothing computed: bit-equal


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module", params=API_SERVERS)
def server(graphs, request):
    env = {}  # each batch waits for company, so that concurrent requests do share batches
    for name in CORPUS:
        env[f"FERRY_MODEL__{name.upper()}__BATCHING__DISPATCH_WHEN_IDLE"] = "false"
        env[f"FERRY_MODEL__{name.upper()}__BATCHING__MAX_QUEUE_DELAY_S"] = "0.02"
    env["FERRY_MODEL__GRU_BATCH_AXIS__BATCH_AXIS"] = "1"
    args = [arg for name, path in graphs.items() for arg in ("--model", f"{name}={path}")]
    options = {"api_servers": request.param}
    with ferry_server([default_model_config()], options, env=env, args=args) as handle:
        yield handle


def infer(server, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """tritonclient's way: binary tensors over HTTP."""
    inputs = []
    for name, array in feeds.items():
        datatype = "BYTES" if array.dtype == object else "FP32"
        tensor = triton_http.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    with triton_http.InferenceServerClient(server.url.removeprefix("http://")) as client:
        result = client.infer(model, inputs)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


@pytest.mark.parametrize("model", list(CORPUS))
def test_every_answer_equals_the_request_run_alone(server, graphs, model):
    rng = np.random.default_rng(abs(hash(model)) % 2**32)
    draw = CORPUS[model][1]
    requests = [draw(rng) for _ in range(REQUESTS)]
    before = metric_value(server.metrics(), "ferry_batch_size_requests_count", model=model)
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda feeds: infer(server, model, feeds), requests))
    session = ort.InferenceSession(str(graphs[model]))
    names = [o.name for o in session.get_outputs()]
    for feeds, answer in zip(requests, answers, strict=True):
        expected = dict(zip(names, session.run(names, feeds), strict=True))
        assert set(answer) == set(expected)
        for name, value in expected.items():
            if model in EXACT:
                got = answer[name].astype(object) if value.dtype == object else answer[name]
                if value.dtype == object:  # tritonclient gives BYTES back as bytes
                    got = np.vectorize(lambda b: b.decode())(got).astype(object)
                np.testing.assert_array_equal(got, value)
            else:
                assert answer[name].shape == value.shape, name
                np.testing.assert_allclose(answer[name], value, rtol=1e-5, atol=1e-6)
    batches = metric_value(server.metrics(), "ferry_batch_size_requests_count", model=model)
    if model in ALONE:
        assert batches - before == REQUESTS  # one request a batch, none split
    else:
        assert batches - before < REQUESTS, "no two requests shared a batch: batching untested"


@pytest.mark.parametrize("model", list(CORPUS))
def test_config_says_each_axis_rule_and_why(server, model):
    with triton_http.InferenceServerClient(server.url.removeprefix("http://")) as client:
        parameters = client.get_model_config(model)["parameters"]
    summary = parameters["ferry.batching"]["string_value"]
    axes = {k: v["string_value"] for k, v in parameters.items() if k.startswith("ferry.axis.")}
    if model in ALONE:
        assert summary.startswith("one request at a time") and ALONE[model] in summary
        assert all(rule.startswith("whole") for rule in axes.values())
    elif model == "gru_batch_axis":  # x [time, batch, 8]
        assert summary == "batched along axis 1"
        assert axes["ferry.axis.x[1]"].startswith("batch (batch)")
        assert axes["ferry.axis.x[0]"].startswith("bucket (time)")
    else:
        assert summary == "batched along axis 0"
        # No mask input in the corpus: no axis past the batch's is padded.
        assert {rule.split(" ")[0] for rule in axes.values()} == {"batch", "bucket"}
