"""bench.variable_length's graph: padding T (with the mask) changes no row's answer, which is what
lets Ferry pad a batch to its longest row; and the lengths span the range the target names."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ferry.bench.variable_length import FEATURES, LONGEST, SHORTEST, bodies, export_model

pytestmark = pytest.mark.unit


def test_padding_a_row_changes_nothing(tmp_path):
    session = ort.InferenceSession(str(export_model(tmp_path)))
    data = np.random.default_rng(1).standard_normal((1, 5, FEATURES)).astype(np.float32)
    alone = session.run(None, {"data": data, "mask": np.ones((1, 5), np.int64)})[0]
    padded_data = np.concatenate([data, np.full((1, 3, FEATURES), 7.0, np.float32)], axis=1)
    mask = np.array([[1] * 5 + [0] * 3], np.int64)
    padded = session.run(None, {"data": padded_data, "mask": mask})[0]
    np.testing.assert_allclose(padded, alone, rtol=1e-6)


def test_lengths_span_the_range():
    lengths = [b["inputs"][1]["shape"][1] for b in bodies(200)]
    assert SHORTEST <= min(lengths) < 2 * SHORTEST
    assert LONGEST / 2 < max(lengths) <= LONGEST
