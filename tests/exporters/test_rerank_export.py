"""`ferry export onnx --task rerank`: a cross-encoder's graph takes segment ids, and a head of
more than one logit is refused."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from ferry.backends.manifest import ModelManifest
from ferry.exporters.onnx_export import export_encoder
from tests.exporters.tiny_bert import build_tiny_bert

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("labels", [1, 3])
def test_rerank_export_takes_segment_ids_and_wants_one_logit(default_model_dir, tmp_path, labels):
    bert = build_tiny_bert(labels, default_model_dir, tmp_path / "hf")
    if labels != 1:
        with pytest.raises(ValueError, match="3 labels"):
            export_encoder(bert.source, tmp_path / "onnx", task="rerank", max_length=128)
        return
    report = export_encoder(bert.source, tmp_path / "onnx", task="rerank", max_length=128)
    assert report.max_abs_diff <= 1e-5  # parity with segment ids of 0 and 1 in every row
    session = ort.InferenceSession(str(report.onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert names == ["input_ids", "attention_mask", "token_type_ids"]
    assert [list(o.shape) for o in session.get_outputs()] == [["batch", 1]]
    assert ModelManifest.read(tmp_path / "onnx").task == "rerank"
