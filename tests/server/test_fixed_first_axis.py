"""A graph with a fixed first axis is served one request at a time: said at start-up and in
/v2/models/{m}/config, naming the tensor and the fix (backends/batch_plan.py)."""

from __future__ import annotations

import logging

import onnxruntime as ort
import pytest
from google.protobuf import json_format
from prometheus_client import CollectorRegistry
from tritonclient.grpc import model_config_pb2

from ferry.backends.batch_plan import plan_batching
from ferry.backends.tensor_signature import read_signature
from ferry.server.graph_runtime import GraphRuntime
from ferry.server.kserve.tensor_config import tensor_config
from ferry.server.metrics import FerryMetrics
from ferry.server.settings import ModelSettings
from tests.support import plain_graphs

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def onnxmltools_lightgbm(tmp_path_factory):
    """onnxmltools' own LightGBM conversion: its `label` output declared [1]."""
    from lightgbm import LGBMClassifier
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    x, y = plain_graphs.breast_cancer_rows(), plain_graphs.breast_cancer_labels()
    model = LGBMClassifier(n_estimators=5, n_jobs=1, verbose=-1).fit(x, y)
    graph = convert_lightgbm(model, initial_types=[("input", FloatTensorType([None, 30]))])
    path = tmp_path_factory.mktemp("lgbm") / "lgbm.onnx"
    path.write_bytes(graph.SerializeToString())
    return path


def unbatched_note(path) -> str:
    signature = read_signature(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]))
    return plan_batching(signature, None).why_alone


def test_the_note_names_each_tensor_that_fixes_the_first_axis(onnxmltools_lightgbm):
    note = unbatched_note(onnxmltools_lightgbm)
    assert note.startswith("output 'label' declares axis 0 = 1;")
    assert "ferry export sklearn" in note and "dim_param" in note
    iris = unbatched_note(plain_graphs.iris_graph())  # [3, 2] in, [3] out
    assert "input 'float_input' declares axis 0 = 3" in iris


def test_a_batchable_graph_has_no_note(tmp_path):
    exported = plain_graphs.breast_cancer(tmp_path / "lgbm.onnx", "lightgbm")  # Ferry's export
    assert unbatched_note(exported) == ""


async def test_start_up_logs_it_and_config_carries_it(onnxmltools_lightgbm, caplog):
    settings = ModelSettings(name="lgbm", path=onnxmltools_lightgbm)
    model = GraphRuntime(settings, onnxmltools_lightgbm, FerryMetrics(CollectorRegistry()))
    try:
        with caplog.at_level(logging.WARNING, logger="ferry.server.graph_runtime"):
            await model.start()
        assert not model.batchable
        said = [r.getMessage() for r in caplog.records if "one request at a time" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("model 'lgbm': one request at a time: ")
        config = tensor_config(model)
        assert config["max_batch_size"] == 0
        assert (
            "output 'label' declares axis 0 = 1"
            in config["parameters"]["ferry.batching"]["string_value"]
        )
        # A Triton ModelConfig still: the gRPC service parses the same JSON.
        json_format.ParseDict(config, model_config_pb2.ModelConfig())
    finally:
        await model.close(0)
