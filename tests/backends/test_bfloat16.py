"""BF16 as uint16 bits, checked against ml_dtypes' bfloat16 (tritonclient's) and ONNX Runtime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from ferry.backends import bfloat16
from tests.support import plain_graphs

pytestmark = pytest.mark.unit

RNG = np.random.default_rng(16)


def test_bits_convert_as_ml_dtypes_does_rounding_to_nearest_even():
    values = np.concatenate([RNG.normal(scale=1e3, size=1000), [0.0, -0.0, 1.0, 1 + 2**-8]])
    values = values.astype(np.float32)
    bits = bfloat16.from_float32(values)
    np.testing.assert_array_equal(bits, values.astype(ml_dtypes.bfloat16).view(np.uint16))
    np.testing.assert_array_equal(bfloat16.to_float32(bits), bits.view(ml_dtypes.bfloat16))


def test_bits_go_through_onnx_runtime_unchanged(tmp_path):
    session = ort.InferenceSession(str(plain_graphs.bfloat16(tmp_path / "bf16.onnx")))
    bits = bfloat16.from_float32(RNG.normal(size=(4, 2)))
    same, square = session.run_with_ort_values(["same", "square"], {"x": bfloat16.ort_value(bits)})
    np.testing.assert_array_equal(bfloat16.ort_bits(same), bits)
    np.testing.assert_array_equal(square.numpy(), bfloat16.to_float32(bits) ** 2)
