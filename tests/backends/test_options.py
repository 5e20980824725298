"""Backend options: `kind` picks the type, each type takes only its own keys, and a backend is
built from its options as they are."""

import pytest
from pydantic import TypeAdapter, ValidationError

from ferry.backends.onnxruntime import OnnxRuntimeBackend
from ferry.backends.options import BackendOptions, OnnxRuntimeOptions, TorchOptions, TritonOptions

pytestmark = pytest.mark.unit

OPTIONS = TypeAdapter(BackendOptions)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({}, OnnxRuntimeOptions),  # no kind: the default backend's
        ({"kind": "onnxruntime", "sessions": 3}, OnnxRuntimeOptions),
        ({"kind": "torch", "dtype": "float16"}, TorchOptions),
        ({"kind": "triton", "url": "t:8001"}, TritonOptions),
    ],
)
def test_kind_picks_the_options_type(table, expected):
    assert type(OPTIONS.validate_python(table)) is expected


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"kind": "tensorflow"}, "kind must be onnxruntime, torch or triton"),
        ({"kind": "triton", "sessions": 2}, "sessions"),  # an ONNX Runtime option on Triton
        ({"kind": "torch", "dtype": "int8"}, "dtype"),
        ({"sessions": 65}, "sessions"),
    ],
)
def test_bad_options_name_the_field(table, field):
    with pytest.raises(ValidationError, match=field):
        OPTIONS.validate_python(table)


def test_onnxruntime_backend_takes_every_option(tmp_path):
    options = OnnxRuntimeOptions(
        sessions=3, intra_op_threads=2, spin_threads=True, device="cpu", allow_cpu_fallback=True
    )
    backend = OnnxRuntimeBackend.from_options(tmp_path / "model.onnx", options)
    assert backend.model_path == tmp_path / "model.onnx"
    assert (backend.max_concurrency, backend._auto) == (3, False)
    assert (backend._intra_op_threads, backend._spin_threads) == (2, True)
    assert (backend._device, backend._allow_cpu_fallback) == ("cpu", True)
