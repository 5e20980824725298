"""Why a plain graph is served one request at a time, and what would batch it.

A graph batches only when the first axis of every input and output is dynamic (Triton's rule,
`Signature.batchable`). Some converters declare one fixed (onnxmltools' LightGBM graphs declare
their `label` output [1]): such a graph runs one request at a time, which its answers do not
show. The note says so at start-up and in /v2/models/{m}/config (`parameters`), naming the
tensors and the fix.
"""

from __future__ import annotations

from ferry.backends.tensor_signature import Signature, TensorSpec

# The key of /config's `parameters` (Triton's map of {"string_value": ...}) that holds the note.
CONFIG_KEY = "ferry.unbatched"
FIX = (
    "re-export with a dynamic batch axis (`ferry export sklearn` declares one for scikit-learn, "
    "XGBoost and LightGBM models), or set that axis to a named dim in the graph "
    "(onnx: `<tensor>.type.tensor_type.shape.dim[0].dim_param = 'N'`)"
)


def _fixed(spec: TensorSpec) -> str | None:
    if spec.class_map or (spec.shape and isinstance(spec.shape[0], str)):
        return None
    return f"declares axis 0 = {spec.shape[0]}" if spec.shape else "declares no axes (a scalar)"


def unbatched_note(signature: Signature) -> str | None:
    """None for a batchable graph; else which tensors fix the first axis, and the fix."""
    fixed = [
        f"{side} {spec.name!r} {why}"
        for side, specs in (("input", signature.inputs), ("output", signature.outputs))
        for spec in specs
        if (why := _fixed(spec)) is not None
    ]
    if not fixed:
        return None
    return f"served one request at a time because {', '.join(fixed)}; {FIX}"


def config_parameters(signature: Signature) -> dict[str, dict[str, str]]:
    """The note as /config's `parameters` entries (none for a batchable graph)."""
    note = unbatched_note(signature)
    return {} if note is None else {CONFIG_KEY: {"string_value": note}}
