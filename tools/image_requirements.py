"""Print the requirements the Docker image installs for a variant, read from pyproject.toml.

The Dockerfile installs these before copying the sources, so that editing code does not reinstall
every dependency. Both variants get the `triton` extra (Ferry's Triton backend). For the `gpu`
variant, onnxruntime-gpu gets its `cuda` and `cudnn` extras: the CUDA and cuDNN wheels it names
itself, so the image's CUDA matches the one ONNX Runtime was built against by construction, with
no CUDA base image.

    python tools/image_requirements.py --variant cpu [--vllm] [--pyproject PATH]
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

VARIANTS = ("cpu", "gpu")
# The extras of onnxruntime-gpu that pull nvidia-cuda-runtime, cuBLAS, cuFFT, cuRAND and cuDNN.
CUDA_EXTRAS = "[cuda,cudnn]"


def requirements(pyproject: dict, variant: str, with_vllm: bool = False) -> list[str]:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, not {variant!r}")
    project = pyproject["project"]
    extras = project["optional-dependencies"]
    # The Triton client too: a model on the Triton backend is the compose stack's use of Triton.
    reqs = [*project["dependencies"], *extras[variant], *extras["triton"]]
    if with_vllm:
        reqs += extras["vllm"]
    if variant == "gpu":
        reqs = [_with_cuda_extras(r) for r in reqs]
        if not any(r.startswith("onnxruntime-gpu" + CUDA_EXTRAS) for r in reqs):
            raise ValueError("the gpu extra does not name onnxruntime-gpu")
    return reqs


def _with_cuda_extras(requirement: str) -> str:
    # "onnxruntime-gpu>=1.31" -> "onnxruntime-gpu[cuda,cudnn]>=1.31"; other names unchanged.
    m = re.fullmatch(r"onnxruntime-gpu(\[[^\]]*\])?(.*)", requirement)
    return f"onnxruntime-gpu{CUDA_EXTRAS}{m.group(2)}" if m else requirement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--vllm", action="store_true")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args()
    pyproject = tomllib.loads(args.pyproject.read_text())
    print("\n".join(requirements(pyproject, args.variant, args.vllm)))


if __name__ == "__main__":
    main()
