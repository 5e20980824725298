"""ONNX equivalents of the models Triton's example clients and qa tests call, built with
onnx.helper at test time, and a Ferry process serving them over HTTP and gRPC.

Each graph is the one Triton ships or generates (`docs/examples/model_repository`,
`qa/common/gen_qa_identity_models.py`), with the names, datatypes and shapes its clients
check; Triton's `max_batch_size` becomes the model's `batching.max_batch_size`:

- simple, simple_int8, simple_string: INPUT0, INPUT1 [-1, 16] -> OUTPUT0 = sum, OUTPUT1 =
  difference (INT32, INT8; BYTES holding decimal numbers, cast as Triton's graph casts them).
- simple_identity (BYTES) and simple_identity_int64: INPUT0 [-1, -1] -> OUTPUT0, itself
  (Triton's is a Python model; an Identity node is the same function).
- onnx_zero_<n>_<type>: the qa identity models, INPUTi -> OUTPUTi, each axis of its own name
  (Triton's generator names every variable axis apart), with the qa variants `_1_element`
  (a BYTES input of one element) and `_queue` (a queue of one request).
- densenet_onnx: Triton's image example's names and shapes (data_0 [3, 224, 224] FP32, NCHW ->
  fc6_1 [1000] with labels), unbatched; its scores are a fixed linear map of the channel means,
  not a trained network (the clients check the protocol, not the classes).
- custom_identity_int32: memory_growth_test's model, INPUT0 [-1, -1] INT32 -> OUTPUT0.

Graph files are written once per session (`triton_models_dir`); `triton_server` serves them
all on one process (module scoped, as the suites that use it start it once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ferry.bench.processes import free_port
from ferry.bench.server_process import FerryProcess, ferry_server

OPSET = [helper.make_opsetid("", 17)]
TRITON_MAX_BATCH = 8  # every batching model in Triton's example repository
IMAGE_CLASSES = 1000


@dataclass(frozen=True)
class TritonModel:
    """A graph and how Triton's config serves it (`max_batch_size` 0: not batched)."""

    name: str
    build: Any  # (path) -> path
    max_batch_size: int = TRITON_MAX_BATCH
    settings: dict[str, Any] = field(default_factory=dict)  # more [[models]] entries


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="triton")
    model.ir_version = 8  # what every onnxruntime since 1.14 reads
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _add_sub(name: str, io_type: int, compute_type: int):
    """Triton's simple models: casts in, Add and Sub, casts out (to the input type)."""

    def build(path: Path) -> Path:
        nodes = [
            helper.make_node("Cast", ["INPUT0"], ["_INPUT0"], to=compute_type),
            helper.make_node("Cast", ["INPUT1"], ["_INPUT1"], to=compute_type),
            helper.make_node("Add", ["_INPUT0", "_INPUT1"], ["SUM"]),
            helper.make_node("Sub", ["_INPUT0", "_INPUT1"], ["DIFF"]),
            helper.make_node("Cast", ["SUM"], ["OUTPUT0"], to=io_type),
            helper.make_node("Cast", ["DIFF"], ["OUTPUT1"], to=io_type),
        ]
        tensors = [("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1")]
        inputs, outputs = (
            [helper.make_tensor_value_info(n, io_type, ["batch", 16]) for n in names]
            for names in tensors
        )
        return _save(helper.make_graph(nodes, name, inputs, outputs), path)

    return build


def _identity(name: str, elem: int, io_count: int, dims: list[int | None]):
    """Triton's qa identity models: INPUTi -> OUTPUTi; a variable axis (None) is named apart in
    every tensor (var_0, var_1, ...), as `gen_qa_identity_models.py` names them."""

    def build(path: Path) -> Path:
        counter = iter(range(1000))

        def shape() -> list[int | str]:
            return ["batch", *(d if d is not None else f"var_{next(counter)}" for d in dims)]

        nodes, inputs, outputs = [], [], []
        for i in range(io_count):
            inputs.append(helper.make_tensor_value_info(f"INPUT{i}", elem, shape()))
            outputs.append(helper.make_tensor_value_info(f"OUTPUT{i}", elem, shape()))
            nodes.append(helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]))
        return _save(helper.make_graph(nodes, name, inputs, outputs), path)

    return build


def densenet(path: Path) -> Path:
    """data_0 [3, 224, 224] -> fc6_1 [1000]: the channel means times a fixed [3, 1000] matrix."""
    weights = np.random.default_rng(0).standard_normal((3, IMAGE_CLASSES)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["data_0"], ["means"], axes=[1, 2], keepdims=0),
        helper.make_node("Constant", [], ["w"], value=numpy_tensor("w", weights)),
        helper.make_node("MatMul", ["means", "w"], ["fc6_1"]),
    ]
    graph = helper.make_graph(
        nodes,
        "densenet_onnx",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [IMAGE_CLASSES])],
    )
    return _save(graph, path)


def image_classifier(path: Path) -> Path:
    """preprocess_inception_ensemble's stand-in: INPUT [N, 3, 224, 224] FP32 -> OUTPUT
    [N, 1000], the channel means times a fixed matrix; Ferry's image preprocessing (declared in
    its settings) takes the encoded images Triton's ensemble decodes with DALI."""
    weights = np.random.default_rng(1).standard_normal((3, IMAGE_CLASSES)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["INPUT"], ["means"], axes=[2, 3], keepdims=0),
        helper.make_node("Constant", [], ["w"], value=numpy_tensor("w", weights)),
        helper.make_node("MatMul", ["means", "w"], ["OUTPUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "preprocess_inception_ensemble",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", IMAGE_CLASSES])],
    )
    return _save(graph, path)


def numpy_tensor(name: str, array: np.ndarray) -> TensorProto:
    return onnx.numpy_helper.from_array(array, name)


IMAGE_LABELS = tuple(f"CLASS_{i}" for i in range(IMAGE_CLASSES))

STRING, INT32, INT64 = TensorProto.STRING, TensorProto.INT32, TensorProto.INT64
FP32, FP16 = TensorProto.FLOAT, TensorProto.FLOAT16

MODELS = (
    TritonModel("simple", _add_sub("simple", INT32, INT32)),
    TritonModel("simple_int8", _add_sub("simple_int8", TensorProto.INT8, INT32)),
    TritonModel("simple_string", _add_sub("simple_string", STRING, INT32)),
    TritonModel("simple_identity", _identity("simple_identity", STRING, 1, [None])),
    TritonModel("simple_identity_int64", _identity("simple_identity_int64", INT64, 1, [None])),
    TritonModel("onnx_zero_1_float32", _identity("onnx_zero_1_float32", FP32, 1, [None])),
    TritonModel(
        "onnx_zero_1_float32_queue",
        _identity("onnx_zero_1_float32_queue", FP32, 1, [None]),
        settings={"batching": {"max_queue_size": 1, "max_queue_delay_s": 1.0}},
    ),
    TritonModel("onnx_zero_3_float32", _identity("onnx_zero_3_float32", FP32, 3, [None])),
    TritonModel("onnx_zero_1_float16", _identity("onnx_zero_1_float16", FP16, 1, [None, None])),
    TritonModel("onnx_zero_1_object", _identity("onnx_zero_1_object", STRING, 1, [None])),
    TritonModel(
        "onnx_zero_1_object_1_element", _identity("onnx_zero_1_object_1_element", STRING, 1, [1])
    ),
    TritonModel("custom_identity_int32", _identity("custom_identity_int32", INT32, 1, [None])),
    TritonModel(
        "preprocess_inception_ensemble",
        image_classifier,
        settings={"labels": {"OUTPUT": IMAGE_LABELS}, "preprocess": {"resize": 224}},
    ),
    TritonModel(
        "densenet_onnx",
        densenet,
        max_batch_size=0,
        settings={"labels": {"fc6_1": IMAGE_LABELS}},
    ),
)
BY_NAME = {m.name: m for m in MODELS}


def write_models(directory: Path, names: tuple[str, ...] | None = None) -> dict[str, Path]:
    """Each model's graph written under `directory` (all of them unless `names`)."""
    chosen = MODELS if names is None else tuple(BY_NAME[n] for n in names)
    return {m.name: m.build(directory / f"{m.name}.onnx") for m in chosen}


def model_configs(paths: dict[str, Path]) -> list[dict[str, Any]]:
    """[[models]] entries serving each graph as Triton's config does: one ONNX Runtime session,
    batches up to max_batch_size (an unbatched model: one request at a time)."""
    configs = []
    for name, path in paths.items():
        model = BY_NAME[name]
        batching = {"max_batch_size": max(model.max_batch_size, 1)}
        batching.update(model.settings.get("batching", {}))
        extra = {k: v for k, v in model.settings.items() if k != "batching"}
        configs.append(
            {
                "name": name,
                "path": str(path),
                "backend": {"kind": "onnxruntime", "sessions": 1},
                "batching": batching,
                **extra,
            }
        )
    return configs


@contextlib.contextmanager
def triton_server(
    directory: Path, names: tuple[str, ...] | None = None, **server: Any
) -> Iterator[FerryProcess]:
    """Ferry serving Triton's example models over HTTP and gRPC; the handle carries
    `http_address` and `grpc_address` (host:port, as Triton's clients take `-u`)."""
    grpc_port = free_port()
    configs = model_configs(write_models(directory, names))
    # Triton's health-metadata examples check the server's name.
    server = {"grpc_port": grpc_port, "kserve_server_name": "triton", **server}
    # Thirteen models to load and calibrate, on a shared CI machine.
    with ferry_server(configs, server=server, ready_timeout_s=180) as handle:
        handle.http_address = handle.url.removeprefix("http://")  # type: ignore[attr-defined]
        handle.grpc_address = f"127.0.0.1:{grpc_port}"  # type: ignore[attr-defined]
        yield handle
