"""Check, inside the GPU image, that the CUDA wheels match what onnxruntime-gpu was built against.

Two checks, no GPU needed: every `nvidia-*` requirement onnxruntime-gpu declares for its `cuda`
and `cudnn` extras is installed at a version it accepts, and ONNX Runtime's CUDA provider library
loads with them (a missing or mismatched libcudart/libcudnn fails here, where at serve time ONNX
Runtime would fall back to the CPU with only a warning). Exits 1 naming what disagrees.

    python tools/check_cuda_wheels.py
"""

from __future__ import annotations

import ctypes
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

EXTRAS = ("cuda", "cudnn")


def mismatches(requires_dist: list[str], installed: dict[str, str]) -> list[str]:
    """What of onnxruntime-gpu's CUDA requirements `installed` (name -> version) does not meet."""
    problems = []
    for line in requires_dist:
        req = Requirement(line)
        if req.marker is None or not any(req.marker.evaluate({"extra": e}) for e in EXTRAS):
            continue
        have = installed.get(req.name)
        if have is None:
            problems.append(f"{req.name} missing (onnxruntime-gpu needs {req})")
        elif not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} {have} installed, onnxruntime-gpu needs {req}")
    if not any(Requirement(r).name.startswith("nvidia-") for r in requires_dist):
        problems.append("onnxruntime-gpu declares no nvidia-* requirements: not a CUDA build?")
    return problems


def _installed() -> dict[str, str]:
    return {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}


def main() -> int:
    problems = mismatches(metadata.requires("onnxruntime-gpu") or [], _installed())
    if problems:
        print("CUDA wheels do not match onnxruntime-gpu:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    import onnxruntime

    # Loads libcudart, cuBLAS, cuFFT, cuRAND and cuDNN from the nvidia-* wheels, then the provider.
    onnxruntime.preload_dlls(cuda=True, cudnn=True, msvc=False)
    capi = Path(onnxruntime.__file__).parent / "capi"
    ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(capi / "libonnxruntime_providers_cuda.so"))
    cuda = {n: v for n, v in _installed().items() if n.startswith("nvidia-")}
    print(f"onnxruntime-gpu {onnxruntime.__version__}: CUDA provider loads with", cuda)
    return 0


if __name__ == "__main__":
    sys.exit(main())
