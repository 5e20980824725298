"""Write a Triton model repository for a Ferry ONNX export, batching like Ferry's batcher.

Three flavours of the same model, each its own repository folder:
- `python`: Triton's python backend runs the ONNX graph with ONNX Runtime on the CPU (the only
  backend in the `nvidia-pytriton` server binary used by the tests). Inputs are
  `allow_ragged_batch` so requests of different lengths still batch together.
- `onnxruntime`: Triton's onnxruntime backend (`onnxruntime_onnx`), for GPU hosts.
- `tensorrt`: a TensorRT plan (`tensorrt_plan`) built by `ferry export tensorrt`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ferry.backends.manifest import ModelManifest
from ferry.batcher.policy import BatchLimits

Flavour = Literal["python", "onnxruntime", "tensorrt"]
FLAVOURS: tuple[Flavour, ...] = ("python", "onnxruntime", "tensorrt")
PYTHON_MODEL = Path(__file__).with_name("triton_python_model.py")
MODEL_FILES: dict[Flavour, str] = {
    "python": "model.onnx",
    "onnxruntime": "model.onnx",
    "tensorrt": "model.plan",
}
ONNX_TO_TRITON = {1: "TYPE_FP32", 7: "TYPE_INT64", 10: "TYPE_FP16", 6: "TYPE_INT32"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str
    dims: tuple[int, ...]  # without the batch axis; -1 where the size varies

    def to_pbtxt(self, ragged: bool = False) -> str:
        dims = ", ".join(str(d) for d in self.dims)
        extra = " allow_ragged_batch: true" if ragged else ""
        return f'  {{ name: "{self.name}" data_type: {self.data_type} dims: [ {dims} ]{extra} }}'


@dataclass(frozen=True)
class Batching:
    """The batcher settings Triton's dynamic batcher should mirror (Ferry's own defaults)."""

    max_batch_size: int = BatchLimits.max_batch_size
    max_queue_delay_s: float = BatchLimits.max_queue_delay_s
    instances: int = 1

    @property
    def preferred_batch_sizes(self) -> tuple[int, ...]:
        # Ferry closes a batch when it is full or the delay window ends; Triton's batcher does the
        # same when the only preferred size is the maximum.
        return (self.max_batch_size,)


@dataclass(frozen=True)
class ModelConfig:
    name: str
    flavour: Flavour
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batching: Batching
    parameters: dict[str, str] = field(default_factory=dict)

    def to_pbtxt(self) -> str:
        b = self.batching
        head = {
            "python": 'backend: "python"',
            "onnxruntime": 'platform: "onnxruntime_onnx"',
            "tensorrt": 'platform: "tensorrt_plan"',
        }[self.flavour]
        kind = "KIND_CPU" if self.flavour == "python" else "KIND_GPU"
        ragged = self.flavour == "python"
        preferred = ", ".join(str(s) for s in b.preferred_batch_sizes)
        lines = [
            f'name: "{self.name}"',
            head,
            f"max_batch_size: {b.max_batch_size}",
            "input [",
            ",\n".join(t.to_pbtxt(ragged) for t in self.inputs),
            "]",
            "output [",
            ",\n".join(t.to_pbtxt() for t in self.outputs),
            "]",
            "dynamic_batching {",
            f"  preferred_batch_size: [ {preferred} ]",
            f"  max_queue_delay_microseconds: {round(b.max_queue_delay_s * 1_000_000)}",
            "}",
            f"instance_group [ {{ count: {b.instances} kind: {kind} }} ]",
        ]
        for key, value in self.parameters.items():
            lines.append(f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
        return "\n".join(lines) + "\n"


def tensor_specs(onnx_path: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs and outputs of an ONNX graph, batch axis dropped, symbolic sizes as -1."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph

    def spec(value) -> TensorSpec:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        return TensorSpec(value.name, ONNX_TO_TRITON[tensor.elem_type], dims[1:])

    return tuple(spec(v) for v in graph.input), tuple(spec(v) for v in graph.output)


def build_config(
    model_dir: Path, name: str, flavour: Flavour, batching: Batching, intra_op_threads: int = 1
) -> ModelConfig:
    inputs, outputs = tensor_specs(model_dir / "model.onnx")
    parameters: dict[str, str] = {}
    if flavour == "python":
        manifest = ModelManifest.read(model_dir)
        parameters = {
            "onnx_file": MODEL_FILES["python"],
            "intra_op_threads": str(intra_op_threads),
            "pad_token_id": str(manifest.pad_token_id),
        }
    return ModelConfig(name, flavour, inputs, outputs, batching, parameters)


def write_repository(
    model_dir: Path,
    repository: Path,
    flavour: Flavour,
    batching: Batching,
    name: str | None = None,
    plan: Path | None = None,
    copy_model: bool = True,
    intra_op_threads: int = 1,
) -> Path:
    """Write `<repository>/<name>/config.pbtxt` and version 1; returns the model folder.

    `copy_model=False` writes only the config (and model.py): what `triton_models/` commits,
    the weights being built on the host.
    """
    name = name or model_dir.name
    config = build_config(model_dir, name, flavour, batching, intra_op_threads)
    folder = repository / name
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config.to_pbtxt())
    if flavour == "python":
        shutil.copy(PYTHON_MODEL, version / "model.py")
    if copy_model:
        if flavour == "tensorrt":
            if plan is not None:
                shutil.copy(plan, version / MODEL_FILES["tensorrt"])
        else:
            shutil.copy(model_dir / "model.onnx", version / MODEL_FILES[flavour])
    return folder
