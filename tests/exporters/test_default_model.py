"""The default model's export: parity with PyTorch, dynamic axes, and the manifest."""

from pathlib import Path

import numpy as np
import onnx
import pytest

from ferry.backends.manifest import ModelManifest
from ferry.exporters.default_model import export_default_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, float]:
    out = tmp_path_factory.mktemp("minilm")
    report = export_default_model(out)
    return out, report.max_abs_diff


def test_onnx_matches_pytorch_within_1e_5(exported):
    _, max_abs_diff = exported
    assert max_abs_diff <= 1e-5


def test_graph_takes_ids_and_mask_with_dynamic_batch_and_sequence(exported):
    out, _ = exported
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    inputs = {i.name: i for i in graph.input}
    assert set(inputs) == {"input_ids", "attention_mask"}
    for tensor in inputs.values():
        assert tensor.type.tensor_type.elem_type == onnx.TensorProto.INT64
        dims = [d.dim_param for d in tensor.type.tensor_type.shape.dim]
        assert dims == ["batch", "sequence"]
    assert [o.name for o in graph.output] == ["last_hidden_state", "sentence_embedding"]


def test_embedding_is_l2_normalised_mean_pool(exported):
    import onnxruntime as ort

    out, _ = exported
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[101, 7592, 2088, 102, 0, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1, 0, 0]], dtype=np.int64)
    hidden, embedding = session.run(None, {"input_ids": ids, "attention_mask": mask})
    pooled = hidden[0, :4].mean(axis=0)
    assert np.allclose(embedding[0], pooled / np.linalg.norm(pooled), atol=1e-5)


def test_manifest_records_the_serving_limits(exported):
    manifest = ModelManifest.read(exported[0])
    assert (manifest.task, manifest.max_length, manifest.vocab_size) == ("embedding", 256, 30522)
