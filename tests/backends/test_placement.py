"""Device choice, and the refusal to run on the CPU a model configured for the GPU.

Here the onnxruntime build really is CPU-only: asking it for CUDA is the real failure.
"""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest

from ferry.backends.onnxruntime import OnnxRuntimeBackend
from ferry.backends.ort_cuda import run_bound
from ferry.backends.placement import (
    CPU_EP,
    CUDA_EP,
    DeviceUnavailable,
    check_session_providers,
    onnxruntime_providers,
    torch_device,
)
from ferry.bench.server_process import default_model_config, ferry_server

pytestmark = pytest.mark.integration

CPU_ONLY = [CPU_EP]
WITH_CUDA = [CUDA_EP, CPU_EP]
cpu_only_onnxruntime = pytest.mark.skipif(
    CUDA_EP in ort.get_available_providers(), reason="checks a CPU-only onnxruntime build"
)


def test_auto_follows_the_build_and_cpu_is_always_last():
    assert onnxruntime_providers("auto", CPU_ONLY, False) == [CPU_EP]
    assert onnxruntime_providers("auto", WITH_CUDA, False) == [CUDA_EP, CPU_EP]
    assert onnxruntime_providers("cuda", WITH_CUDA, False) == [CUDA_EP, CPU_EP]
    assert onnxruntime_providers("cpu", WITH_CUDA, False) == [CPU_EP]


def test_cuda_on_a_cpu_build_refuses_naming_the_way_out():
    with pytest.raises(DeviceUnavailable, match=r"m: configured for the GPU.*allow_cpu_fallback"):
        onnxruntime_providers("cuda", CPU_ONLY, False, "m")


def test_allowed_fallback_runs_on_the_cpu_and_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        assert onnxruntime_providers("cuda", CPU_ONLY, True, "m") == [CPU_EP]
    assert "running on the CPU" in caplog.text


def test_session_that_lost_the_cuda_ep_is_refused():
    # onnxruntime-gpu whose CUDA libraries are missing builds a CPU-only session, and only logs.
    with pytest.raises(DeviceUnavailable, match="CUDA EP failed to load"):
        check_session_providers(WITH_CUDA, [CPU_EP], False, "m")
    check_session_providers(WITH_CUDA, [CUDA_EP, CPU_EP], False, "m")
    check_session_providers([CPU_EP], [CPU_EP], False, "m")
    check_session_providers(WITH_CUDA, [CPU_EP], True, "m")


def test_torch_device_choice():
    assert torch_device("auto", True, False, "m") == "cuda"
    assert torch_device("auto", False, False, "m") == "cpu"
    assert torch_device("cpu", True, False, "m") == "cpu"
    assert torch_device("cuda", False, True, "m") == "cpu"
    with pytest.raises(DeviceUnavailable):
        torch_device("cuda", False, False, "m")


@cpu_only_onnxruntime
async def test_backend_configured_for_cuda_refuses_to_start(default_model_dir):
    backend = OnnxRuntimeBackend(default_model_dir / "model.onnx", sessions=1, device="cuda")
    with pytest.raises(DeviceUnavailable):
        await backend.start()
    assert not await backend.health()
    allowed = OnnxRuntimeBackend(
        default_model_dir / "model.onnx", sessions=1, device="cuda", allow_cpu_fallback=True
    )
    await allowed.start()
    try:
        assert allowed.providers == [CPU_EP]
    finally:
        await allowed.close()


@cpu_only_onnxruntime
def test_ferry_serve_exits_with_the_reason():
    with (
        pytest.raises(RuntimeError, match="configured for the GPU") as failure,
        ferry_server([default_model_config(backend={"device": "cuda"})], ready_timeout_s=120),
    ):
        pass
    assert "allow_cpu_fallback = true" in str(failure.value)


def test_io_binding_returns_what_run_returns(default_model_dir):
    # Bound to host memory the CPU EP runs the same binding code as the CUDA path.
    session = ort.InferenceSession(str(default_model_dir / "model.onnx"), providers=[CPU_EP])
    ids = np.asarray([[101, 7592, 2088, 102], [101, 2023, 102, 0]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)}
    names = [o.name for o in session.get_outputs()]
    for got, want in zip(run_bound(session, feeds, names), session.run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, want)
