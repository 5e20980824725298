"""Build a TensorRT plan from a Ferry ONNX export, shaped by the batcher's limits.

The optimisation profile covers exactly what Ferry's batcher can send: batch 1..max_batch_size,
sequence 1..max_length (the manifest's limit). TensorRT tunes its kernels for the `opt` shape,
so that is the full batch at a typical length rather than the extreme.

Without an NVIDIA GPU nothing can be built: `build_plan` raises `NoGpu`, which carries the exact
`trtexec` command to run on a GPU host, and `ferry export tensorrt` exits with code 3.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

INPUTS = ("input_ids", "attention_mask")
# Typical inputs are sentences; kernels tuned for 128 tokens serve 1..max_length well.
TYPICAL_LENGTH = 128
EXIT_NO_GPU = 3


class NoGpu(RuntimeError):
    def __init__(self, command: list[str]) -> None:
        self.command = command
        super().__init__(
            "no NVIDIA GPU here: a TensorRT plan must be built on the GPU it will run on. "
            f"On that host run:\n  {shlex.join(command)}"
        )


@dataclass(frozen=True)
class ShapeProfile:
    """min / opt / max (batch, sequence) for every input."""

    min: tuple[int, int]
    opt: tuple[int, int]
    max: tuple[int, int]

    def trtexec_flags(self) -> list[str]:
        def shapes(shape: tuple[int, int]) -> str:
            return ",".join(f"{name}:{shape[0]}x{shape[1]}" for name in INPUTS)

        return [
            f"--minShapes={shapes(self.min)}",
            f"--optShapes={shapes(self.opt)}",
            f"--maxShapes={shapes(self.max)}",
        ]


def derive_profile(
    max_batch_size: int, max_length: int, opt_length: int = TYPICAL_LENGTH
) -> ShapeProfile:
    if max_batch_size < 1 or max_length < 1:
        raise ValueError("max_batch_size and max_length must be >= 1")
    return ShapeProfile(
        min=(1, 1),
        opt=(max_batch_size, min(opt_length, max_length)),
        max=(max_batch_size, max_length),
    )


def trtexec_command(
    onnx_path: Path,
    plan_path: Path,
    profile: ShapeProfile,
    fp16: bool = True,
    workspace_mib: int = 4096,
) -> list[str]:
    command = [
        "trtexec",
        f"--onnx={onnx_path}",
        f"--saveEngine={plan_path}",
        *profile.trtexec_flags(),
        f"--memPoolSize=workspace:{workspace_mib}M",
    ]
    if fp16:
        command.append("--fp16")
    return command


def gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return probe.returncode == 0 and "GPU" in probe.stdout


def build_plan(onnx_path: Path, plan_path: Path, profile: ShapeProfile, fp16: bool = True) -> Path:
    """trtexec when it is on PATH, else the `tensorrt` Python API; NoGpu without a GPU."""
    command = trtexec_command(onnx_path, plan_path, profile, fp16)
    if not gpu_present():
        raise NoGpu(command)
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("trtexec"):
        subprocess.run(command, check=True)
    else:
        _build_with_python_api(onnx_path, plan_path, profile, fp16)
    return plan_path


def _build_with_python_api(
    onnx_path: Path, plan_path: Path, profile: ShapeProfile, fp16: bool
) -> None:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    shapes = builder.create_optimization_profile()
    for name in INPUTS:
        shapes.set_shape(name, profile.min, profile.opt, profile.max)
    config.add_optimization_profile(shapes)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError("TensorRT failed to build the plan (see the log above)")
    plan_path.write_bytes(bytes(plan))
