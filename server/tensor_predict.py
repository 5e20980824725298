"""/predict for a plain graph: named tensors or tabular records in, one object per row out.

`inputs` is either `{input: nested list}` (rows on the first axis) or a list of records, objects
keyed by the graph's input names (one input per column takes scalars). Each answer row maps the
outputs to that row's values; a ZipMap output is `{class: probability}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from ferry.backends import bfloat16
from ferry.server.errors import InvalidInput
from ferry.server.graph_model import GraphModel, prepare
from ferry.server.image_inputs import json_images
from ferry.server.large_bodies import decoded
from ferry.server.model_outputs import distinct
from ferry.server.replies import Reply, json_reply
from ferry.server.response_size import check_response_size, written
from ferry.server.schemas import MIN_TIMEOUT_MS, Priority
from ferry.server.tensor_inputs import json_tensor, records_tensors


class TensorPredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    inputs: dict[str, Any] | list[Any] = Field(
        description="Named tensors {input: nested list}, or records [{input: value}, ...]."
    )
    outputs: list[StrictStr] | None = None
    timeout_ms: float | None = Field(
        default=None, ge=MIN_TIMEOUT_MS, le=600_000, allow_inf_nan=False
    )
    priority: Priority = 0


def request_tensors(model: GraphModel, inputs: dict[str, Any] | list[Any]) -> dict[str, Any]:
    signature = model.signature
    if isinstance(inputs, list):
        if not inputs:
            raise InvalidInput("inputs", "needs at least one record")
        return records_tensors(signature, inputs)
    tensors = {}
    for name, data in inputs.items():
        if name not in signature.input_names:
            inputs_names = list(signature.input_names)
            raise InvalidInput(name, f"not an input of this model; inputs are {inputs_names}")
        images = json_images(data) if name in signature.images else None
        tensors[name] = images if images is not None else json_tensor(signature.input(name), data)
    return tensors


async def predict_tensors(
    model: GraphModel,
    raw: dict[str, Any],
    disconnected: asyncio.Future[None] | None,
    decide_priority: Callable[[int], int],
    body_bytes: int = 0,
    max_response_bytes: int = 32 * 2**20,
) -> Reply:
    """`decide_priority`: the caller's priority policy (server/tenancy.py) applied to the ask;
    `body_bytes`, the request's size: a large one's tensors are typed off the event loop. The
    answer is refused past `max_response_bytes`, and a large one written off the loop."""
    body = TensorPredictRequest.model_validate(raw)
    outputs = distinct(model.select_outputs(body.outputs))
    try:
        tensors = await decoded(body_bytes, partial(request_tensors, model, body.inputs))
    except InvalidInput:
        model.count_invalid()
        raise
    rows = await prepare(model, tensors)
    timeout_s = body.timeout_ms / 1000 if body.timeout_ms else None
    priority = decide_priority(body.priority)
    result = await model.infer(
        rows, outputs, timeout_s=timeout_s, priority=priority, disconnected=disconnected
    )
    size = check_response_size({name: result[name] for name in outputs}, max_response_bytes)
    return await written(size, partial(_answer, model, result, outputs))


def _answer(model: GraphModel, result: dict[str, np.ndarray], outputs: tuple[str, ...]) -> Reply:
    return json_reply({"model": model.name, "outputs": answer_rows(model, result, outputs)})


def answer_rows(
    model: GraphModel, result: dict[str, np.ndarray], outputs: tuple[str, ...]
) -> list[dict[str, Any]]:
    """One object per row when every output has the rows on its first axis (a batchable graph
    always does); else one object of the whole outputs."""
    result = {  # BF16's bits as the numbers they stand for
        name: bfloat16.to_float32(value)
        if model.signature.output(name).datatype == "BF16"
        else value
        for name, value in result.items()
    }
    counts = {result[name].shape[0] if result[name].ndim else -1 for name in outputs}
    if len(counts) != 1 or -1 in counts:
        return [{name: _plain(result[name]) for name in outputs}]
    (count,) = counts
    keys = {name: [str(k) for k in model.class_keys.get(name, [])] for name in outputs}
    rows = []
    for index in range(count):
        row = {}
        for name in outputs:
            value = result[name][index]
            if model.signature.output(name).class_map:
                row[name] = dict(zip(keys[name], value.tolist(), strict=True))
            else:
                row[name] = _plain(value)
        rows.append(row)
    return rows


def _plain(value: Any) -> Any:
    """A row's value as JSON takes it: a string output's row is a str (or bytes) already."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value.tolist() if hasattr(value, "tolist") else value
