"""Each backend's options: the `[models.backend]` table of a model, told apart by `kind`.

The backends own these types and build themselves from them (`from_options`); the server's
settings only name them as one field, so configuration reads downwards into the backends.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from ferry.backends.placement import Device

TorchDType = Literal["auto", "float32", "float16", "bfloat16"]
TritonProtocol = Literal["http", "grpc"]
TritonMode = Literal["batch", "passthrough"]


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Placement(_Options):
    # `auto` takes the GPU when the runtime can reach one; a model meant for the GPU refuses to
    # start on the CPU unless the fallback is allowed (backends/placement.py).
    device: Device = "auto"
    # Let a model meant for the GPU start on the CPU, with a warning, rather than refuse to.
    allow_cpu_fallback: bool = False


class OnnxRuntimeOptions(_Placement):
    kind: Literal["onnxruntime"] = "onnxruntime"  # ONNX Runtime runs the graph in this process
    # Sessions = batches that may run at once; 0 measures the best count at start.
    sessions: int = Field(default=0, ge=0, le=64)
    intra_op_threads: int = Field(default=1, ge=1, le=256)  # threads per session
    # Let ONNX Runtime's threads spin between ops: faster alone, worse when sessions share cores.
    spin_threads: bool = False
    # One more session, with every core, for a batch that runs alone (low-load latency).
    solo_session: bool = True
    # A plain graph's inference threads and image-decoding processes run this much nicer than
    # the event loop (Linux), which then gets a core first when it has work. 0: one priority.
    # Nice is relative within a cgroup (a container), but on a host shared with other processes
    # the workers also yield to those (bench.variable_length on the shared box: 10 lost to 0).
    worker_niceness: int = Field(default=0, ge=0, le=19)


class TorchOptions(_Placement):
    kind: Literal["torch"]  # PyTorch runs a Hugging Face encoder folder in this process
    # `auto` = float16 on CUDA, float32 on the CPU; compile: torch.compile with dynamic shapes.
    dtype: TorchDType = "auto"
    compile: bool = False  # torch.compile the model, with dynamic shapes
    # On CUDA: each batch replays a CUDA graph captured for its bucket of shapes (rows to a power
    # of two, length to 16/32/.../512) instead of launching every kernel from Python: the GIL is
    # held microseconds a batch, not milliseconds (backends/torch_graphs.py). No effect on the CPU.
    cuda_graphs: bool = False

    @model_validator(mode="after")
    def _check_cuda_graphs(self) -> TorchOptions:
        if self.cuda_graphs and self.device == "cpu":
            raise ValueError('cuda_graphs: no CUDA graph runs on device = "cpu"')
        if self.cuda_graphs and self.compile:
            raise ValueError(
                "cuda_graphs with compile: choose one (torch.compile's own graphs are its "
                'mode = "reduce-overhead"; cuda_graphs captures the eager model)'
            )
        return self


class TritonOptions(_Options):
    kind: Literal["triton"]  # a Triton Inference Server runs the graph; Ferry tokenizes and batches
    url: str = "127.0.0.1:8001"  # the Triton server's address (host:port)
    protocol: TritonProtocol = "grpc"  # how Ferry talks to it: KServe v2 over gRPC or HTTP
    model: str = ""  # the model's name in Triton; empty: Ferry's name for it
    model_version: str = ""  # the model's version in Triton; empty: its latest
    # batch: Ferry's batcher forms the batches Triton runs; passthrough: each request is sent
    # as it came, and Triton's own batcher forms them.
    mode: TritonMode = "batch"
    # Batches in flight to Triton at once (Triton's own instances run them).
    concurrency: int = Field(default=2, ge=1, le=256)


def _backend_kind(options: Any) -> str | None:
    # A [models.backend] table without `kind` is the default backend's.
    if isinstance(options, dict):
        return cast(str | None, options.get("kind", "onnxruntime"))
    return cast(str | None, getattr(options, "kind", None))


BackendOptions = Annotated[
    Annotated[OnnxRuntimeOptions, Tag("onnxruntime")]
    | Annotated[TorchOptions, Tag("torch")]
    | Annotated[TritonOptions, Tag("triton")],
    Discriminator(
        _backend_kind,
        custom_error_type="backend_kind",
        custom_error_message="kind must be onnxruntime, torch or triton",
    ),
]
