"""The one place ONNX Runtime session options are set: threads, optimisation, spinning."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ferry.backends.ort_session import cpu_session, session_options

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("spinning", "allow", "force_stop"), [(True, "1", "1"), (False, "0", None)]
)
def test_options_carry_threads_and_spinning(spinning, allow, force_stop):
    options = session_options(3, spinning)
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    entries = options.get_session_config_entry
    assert entries("session.intra_op.allow_spinning") == allow
    if force_stop:
        assert entries("session.force_spinning_stop") == force_stop
    else:
        with pytest.raises(RuntimeError, match="force_spinning_stop"):
            entries("session.force_spinning_stop")


def test_spinning_left_to_onnxruntime_when_not_said():
    with pytest.raises(RuntimeError, match="allow_spinning"):
        session_options(1).get_session_config_entry("session.intra_op.allow_spinning")


def test_cpu_session_matches_the_reference(default_model_dir, embed_alone):
    session = cpu_session(default_model_dir / "model.onnx", 1)
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.get_session_options().intra_op_num_threads == 1
    ids = np.asarray([[101, 7592, 2088, 102]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    (got,) = session.run(["sentence_embedding"], feeds)
    assert np.max(np.abs(got[0] - embed_alone([101, 7592, 2088, 102]))) <= 1e-5
