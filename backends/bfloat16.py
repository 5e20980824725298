"""BF16 tensors, which numpy has no dtype for: carried as their raw bits in uint16 arrays.

KServe's BF16 is those bits, little-endian, so raw contents (gRPC) and binary data (HTTP) pass
through unchanged. Only ONNX Runtime needs telling: a uint16 array goes in as an OrtValue marked
bfloat16, and a bfloat16 output, which ORT cannot hand back as numpy, is read from its buffer.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

BITS = np.uint16
ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16 (onnx itself is not a serving dependency)


def to_float32(bits: np.ndarray) -> np.ndarray:
    """Exact: every BF16 value is a float32 with its low 16 bits zero."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def from_float32(values: Any) -> np.ndarray:
    """The nearest BF16 (ties to even), as bits: for pad values given as numbers."""
    wide = np.asarray(values, dtype=np.float32).view(np.uint32)
    return ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).astype(BITS)


def ort_value(bits: np.ndarray) -> Any:
    import onnxruntime as ort

    bits = np.ascontiguousarray(bits, dtype=BITS)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, ONNX_BFLOAT16)


def ort_bits(value: Any) -> np.ndarray:
    """A bfloat16 OrtValue's contents as bits (copied out of ORT's buffer)."""
    shape = value.shape()
    size = math.prod(shape) * np.dtype(BITS).itemsize
    raw = ctypes.string_at(value.data_ptr(), size) if size else b""
    return np.frombuffer(raw, dtype=np.dtype(BITS).newbyteorder("=")).reshape(shape)
