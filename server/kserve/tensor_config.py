"""A plain graph described in Triton's shapes, from its signature: model metadata and config.

As Triton's ONNX backend completes a config from the graph: a batchable graph (every first axis
dynamic) has `max_batch_size` > 0 and dims without the batch axis; any other has 0 and its full
shapes. A ZipMap output is an [N, C] FP32 tensor whose class keys the metadata lists.
"""

from __future__ import annotations

from typing import Any

from ferry.backends.image_spec import CHANNELS, IMAGE_DATATYPES
from ferry.backends.tensor_signature import CONFIG_TYPES, TensorSpec
from ferry.server.graph_model import GraphModel, rows_first
from ferry.server.kserve.versions import VERSION

PLATFORM = "onnxruntime_onnx"  # Triton's name for an ONNX Runtime model


def _output_shape(model: GraphModel, spec: TensorSpec) -> list[int]:
    if spec.class_map:
        return [-1, len(model.class_keys.get(spec.name, [])) or -1]
    return spec.metadata_shape()


def tensor_metadata(model: GraphModel) -> dict[str, Any]:
    signature = model.signature
    outputs = []
    for spec in signature.outputs:
        entry: dict[str, Any] = {
            "name": spec.name,
            "datatype": spec.datatype,
            "shape": _output_shape(model, spec),
        }
        if spec.class_map and spec.name in model.class_keys:
            entry["parameters"] = {"classes": [str(k) for k in model.class_keys[spec.name]]}
        outputs.append(entry)
    return {
        "name": model.name,
        "versions": [VERSION],
        "platform": PLATFORM,
        "inputs": [
            {"name": s.name, "datatype": s.datatype, "shape": s.metadata_shape()}
            for s in signature.inputs
        ],
        "outputs": outputs,
    }


def image_format(model: GraphModel, spec: TensorSpec, dims: list[int]) -> str:
    """Triton's `format` of an input, which its image clients read to lay out pixels: the
    layout of the model's image preprocessing, or of an image-like input (three axes after the
    batch, of a pixel datatype) whose channels (3) are first or last alone; else FORMAT_NONE."""
    images = model.images
    if images is not None and images.plan.input == spec.name:
        return f"FORMAT_{images.plan.layout}"
    if len(dims) != 3 or spec.datatype not in IMAGE_DATATYPES:
        return "FORMAT_NONE"
    first, last = dims[0] == CHANNELS, dims[2] == CHANNELS
    if first == last:
        return "FORMAT_NONE"
    return "FORMAT_NCHW" if first else "FORMAT_NHWC"


def tensor_config(model: GraphModel) -> dict[str, Any]:
    """Triton's model configuration JSON."""
    settings, backend, signature = model.settings, model.backend, model.signature
    limits = settings.batching
    batched = rows_first(model)  # as Triton batches: along axis 0
    skip = 1 if batched else 0  # the batch axis is implicit when batching

    def tensor(spec: TensorSpec, shape: list[int]) -> dict[str, Any]:
        return {"name": spec.name, "data_type": CONFIG_TYPES[spec.datatype], "dims": shape[skip:]}

    def input_tensor(spec: TensorSpec) -> dict[str, Any]:
        entry = tensor(spec, spec.metadata_shape())
        return {**entry, "format": image_format(model, spec, entry["dims"])}

    config: dict[str, Any] = {
        "name": model.name,
        "platform": PLATFORM,
        "backend": "onnxruntime",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": limits.max_batch_size if batched else 0,
        "input": [input_tensor(s) for s in signature.inputs],
        "output": [tensor(s, _output_shape(model, s)) for s in signature.outputs],
        "instance_group": [
            {"name": model.name, "kind": "KIND_CPU", "count": backend.max_concurrency}
        ],
    }
    # Ferry's batching rule per axis, and why (Triton's string parameters: gRPC's config too).
    plan = model.batch_plan
    config["parameters"] = {
        "ferry.batching": {"string_value": plan.summary()},
        **{
            f"ferry.axis.{rule.tensor}[{rule.axis}]": {
                "string_value": f"{rule.rule} ({rule.name}): {rule.why}"
            }
            for rule in plan.axes
        },
    }
    if model.batchable:  # along any axis
        config["dynamic_batching"] = {
            "max_queue_delay_microseconds": round(limits.max_queue_delay_s * 1_000_000),
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": round(settings.timeout_s * 1_000_000),
                "max_queue_size": limits.max_queue_size,
            },
        }
    return config
