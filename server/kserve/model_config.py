"""A token model described in Triton's shapes: model metadata and model configuration (a
plain graph's: tensor_config.py).

Both come from the model's real limits (settings, manifest, backend), so perf_analyzer and
tritonclient size their requests as Ferry will batch them. The configuration is Triton's
`ModelConfig` JSON (the HTTP route returns it, the gRPC service parses it into the protobuf).
"""

from __future__ import annotations

from typing import Any

from ferry.server.encoder_model import EncoderModel
from ferry.server.kserve.versions import VERSION

# A UTF-8 text input, tokenized by the server: [batch] or [batch, 1] BYTES, one text per row.
TEXT_INPUT = "text"
TOKEN_INPUTS = ("input_ids", "attention_mask")
# Segment ids: accepted from every client (all zeros change nothing), listed for the models
# whose graph reads them.
TYPES_INPUT = "token_type_ids"


def token_inputs(model: EncoderModel) -> tuple[str, ...]:
    return (*TOKEN_INPUTS, TYPES_INPUT) if model.backend.takes_token_types else TOKEN_INPUTS


def token_metadata(model: EncoderModel) -> dict[str, Any]:
    backend = model.backend
    # Only the axes Ferry knows are given sizes; the rest vary (-1), as the protocol allows.
    outputs = [
        {"name": n, "datatype": "FP32", "shape": [-1] * (3 if n in backend.sequence_outputs else 2)}
        for n in backend.output_names
    ]
    tokens = {"datatype": "INT64", "shape": [-1, -1]}
    return {
        "name": model.name,
        "versions": [VERSION],
        "platform": f"ferry_{backend.name}",
        "inputs": [
            *({"name": n, **tokens} for n in token_inputs(model)),
            {"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1, 1]},
        ],
        "outputs": outputs,
    }


def token_config(model: EncoderModel) -> dict[str, Any]:
    """Triton's model configuration JSON (int64 fields as numbers, as Triton prints them)."""
    settings, backend = model.settings, model.backend
    limits = settings.batching
    # The batch axis is implicit (max_batch_size > 0); every input is optional because a request
    # sends either token ids (with or without a mask) or text.
    inputs = [
        {"name": n, "data_type": "TYPE_INT64", "dims": [-1], "optional": True}
        for n in token_inputs(model)
    ]
    inputs.append({"name": TEXT_INPUT, "data_type": "TYPE_STRING", "dims": [1], "optional": True})
    outputs = [
        {
            "name": n,
            "data_type": "TYPE_FP32",
            "dims": [-1, -1] if n in backend.sequence_outputs else [-1],
        }
        for n in backend.output_names
    ]
    queue_delay_us = round(limits.max_queue_delay_s * 1_000_000)
    return {
        "name": model.name,
        "platform": "",
        "backend": f"ferry_{backend.name}",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": limits.max_batch_size,
        "input": inputs,
        "output": outputs,
        "dynamic_batching": {
            "max_queue_delay_microseconds": queue_delay_us,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": round(settings.timeout_s * 1_000_000),
                "max_queue_size": limits.max_queue_size,
            },
        },
        "instance_group": [
            {"name": model.name, "kind": _instance_kind(backend), "count": backend.max_concurrency}
        ],
        "parameters": {
            "max_sequence_length": {"string_value": str(model.manifest.max_length)},
            "max_batch_tokens": {"string_value": str(limits.max_batch_tokens)},
            "vocab_size": {"string_value": str(model.manifest.vocab_size)},
        },
    }


def _instance_kind(backend: object) -> str:
    # ONNX Runtime names its providers; a GPU one (CUDA, TensorRT) means the batches run there.
    providers = getattr(backend, "providers", None) or []
    return "KIND_GPU" if any(p != "CPUExecutionProvider" for p in providers) else "KIND_CPU"
