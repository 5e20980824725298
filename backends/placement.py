"""Where a backend runs (CPU or an NVIDIA GPU), and the refusal of a silent fall back to the CPU.

ONNX Runtime quietly runs a model on the CPU when its CUDA libraries are missing, and PyTorch
without CUDA does the same by default: a GPU host then serves a fraction of its throughput and
nothing says why. A model configured for the GPU (`device = "cuda"`, or `"auto"` on a host
whose runtime can reach a GPU) therefore refuses to start on the CPU unless its configuration
says `allow_cpu_fallback = true`.
"""

from __future__ import annotations

import logging
from typing import Literal

logger = logging.getLogger(__name__)

Device = Literal["auto", "cpu", "cuda"]
CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"


class DeviceUnavailable(RuntimeError):
    """A model configured for the GPU would run on the CPU, and the fallback is not allowed."""


def fallback_or_refuse(model: str, why: str, allow_cpu_fallback: bool) -> None:
    """Log the fallback when allowed, raise DeviceUnavailable otherwise."""
    if not allow_cpu_fallback:
        raise DeviceUnavailable(
            f"{model}: configured for the GPU but {why}; it would run on the CPU. Fix the GPU "
            'stack, or set allow_cpu_fallback = true (or device = "cpu") in the model\'s '
            "[models.backend] table."
        )
    logger.warning("%s: %s; running on the CPU (allow_cpu_fallback = true)", model, why)


def onnxruntime_providers(
    device: Device, available: list[str], allow_cpu_fallback: bool, model: str = "model"
) -> list[str]:
    """Providers to ask ONNX Runtime for: CUDA first when the GPU is wanted, the CPU last.

    `auto` wants the GPU exactly when this onnxruntime build has the CUDA EP (onnxruntime-gpu
    installed): the build is the configuration's intent, its libraries may still be missing.
    """
    if device == "cpu" or (device == "auto" and CUDA_EP not in available):
        return [CPU_EP]
    if CUDA_EP not in available:
        why = f"this onnxruntime build has no {CUDA_EP} (available: {available})"
        fallback_or_refuse(model, why, allow_cpu_fallback)
        return [CPU_EP]
    return [CUDA_EP, CPU_EP]


def check_session_providers(
    requested: list[str], session_providers: list[str], allow_cpu_fallback: bool, model: str
) -> None:
    """After the session is built: CUDA asked for must be what the session really runs on."""
    if requested[0] == CUDA_EP and (not session_providers or session_providers[0] != CUDA_EP):
        why = (
            f"the ONNX Runtime session runs on {session_providers} (the CUDA EP failed to load: "
            "CUDA 13 / cuDNN 9 libraries missing? see ONNX Runtime's log above)"
        )
        fallback_or_refuse(model, why, allow_cpu_fallback)


def torch_device(device: Device, cuda_available: bool, allow_cpu_fallback: bool, model: str) -> str:
    """`cuda` or `cpu` for PyTorch: `auto` takes the GPU when torch sees one."""
    if device == "cpu" or (device == "auto" and not cuda_available):
        return "cpu"
    if not cuda_available:
        fallback_or_refuse(
            model,
            "torch.cuda.is_available() is False (CPU-only torch, or no driver)",
            allow_cpu_fallback,
        )
        return "cpu"
    return "cuda"
