"""Check, inside the GPU image, that the CUDA wheels match what onnxruntime-gpu was built against.

Three checks, no GPU needed: every `nvidia-*` requirement onnxruntime-gpu declares for its
`cuda` and `cudnn` extras is installed at a version it accepts; the CUDA libraries load; ONNX
Runtime's CUDA provider library finds its dependencies among them. A missing or mismatched
libcudart/libcudnn fails here, where at serve time ONNX Runtime would fall back to the CPU with
only a warning. The provider links the driver's libcuda.so.1, which only the NVIDIA Container
Toolkit brings, so its other dependencies are resolved with `ldd` rather than loaded. Exits 1
naming what disagrees.

    python tools/check_cuda_wheels.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

EXTRAS = ("cuda", "cudnn")
# What preload_dlls() must have loaded: the runtime, the math libraries and cuDNN.
CUDA_LIBS = (
    "libcudart.so",
    "libcublas.so",
    "libcublasLt.so",
    "libcufft.so",
    "libcurand.so",
    "libcudnn.so",
)
DRIVER_LIBS = {"libcuda.so.1"}


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


def unresolved(ldd_output: str) -> set[str]:
    """Libraries `ldd` could not find, less the driver's, which only the container runtime adds."""
    missing = {line.split()[0] for line in ldd_output.splitlines() if "not found" in line}
    return missing - DRIVER_LIBS


def _installed() -> dict[str, str]:
    return {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}


def _loaded(prefixes: tuple[str, ...]) -> set[str]:
    maps = Path("/proc/self/maps").read_text().splitlines()
    names = {Path(line.split()[-1]).name for line in maps if "/" in line}
    return {p for p in prefixes if any(n.startswith(p) for n in names)}


def main() -> int:
    problems = mismatches(metadata.requires("onnxruntime-gpu") or [], _installed())
    if problems:
        print("CUDA wheels do not match onnxruntime-gpu:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    import onnxruntime

    # Loads libcudart, cuBLAS, cuFFT, cuRAND and cuDNN from the nvidia-* wheels into this process.
    onnxruntime.preload_dlls(cuda=True, cudnn=True, msvc=False)
    missing = set(CUDA_LIBS) - _loaded(CUDA_LIBS)
    # The CUDA provider itself links libcuda.so.1 (the driver), absent without a GPU: resolve the
    # rest of its dependencies against the wheels' library folders instead of loading it.
    site = Path(onnxruntime.__file__).parent.parent
    libdirs = sorted({str(p.parent) for p in (site / "nvidia").rglob("lib*.so*")})
    provider = Path(onnxruntime.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    ldd = subprocess.run(
        ["ldd", str(provider)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(libdirs)},
    )
    missing |= unresolved(ldd.stdout)
    if missing:
        print("CUDA libraries that do not load:", *sorted(missing), sep="\n  ", file=sys.stderr)
        return 1
    cuda = {n: v for n, v in _installed().items() if n.startswith("nvidia-")}
    print(f"onnxruntime-gpu {onnxruntime.__version__}: CUDA libraries load;", cuda)
    return 0


if __name__ == "__main__":
    sys.exit(main())
