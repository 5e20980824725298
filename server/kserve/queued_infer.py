"""KServe v2 inference for the direct lane (server/direct_lane.py): a request read, checked and
queued without a coroutine, its answer built when its batch is done.

The steps are the infer handler's (routes/kserve_v2.py), in its order, through the same
functions: the request read, its output regions, priority and top-k
checked, its rows validated and queued, its answer sized and written. Only what the handler
would suspend for is left to it: a model that is not a graph run in this process (an engine
process's, a token model), one that decodes images or batches sequences, a request with
sequence parameters, a priority the policy clamps (said in a header the gateway adds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ferry.server.graph_runtime import GraphRuntime
from ferry.server.kserve.kserve_model import GraphView, KServeModel
from ferry.server.replies import Reply
from ferry.server.routes.kserve_v2 import (
    InferRequest,
    check_classified,
    output_regions,
    read_request,
    request_rows,
    response,
)
from ferry.server.services import Services

Results = Sequence[dict[str, np.ndarray]]


@dataclass(frozen=True)
class QueuedInfer:
    model: str  # its name, for the request's metrics
    futures: list[asyncio.Future[dict[str, np.ndarray]]]  # one per chunk of its rows
    # The chunks' results -> the answer's size and what writes it (as the handler's `written`).
    answer: Callable[[Results], tuple[int, Callable[[], Reply]]]


def queued_infer(
    services: Services, model: KServeModel, body: bytes, header_length: str | None = None
) -> QueuedInfer | None:
    """The request to `model` (looked up by the caller, as the handler looks it up) queued; None
    (nothing done) where the handler must serve it. Raises what the handler raises before its
    request is queued."""
    graph = model.model if isinstance(model, GraphView) else None
    if not isinstance(graph, GraphRuntime) or graph.images is not None:
        return None
    if graph.sequences is not None:
        return None
    regions = services.shared_memory.of(None)
    read: InferRequest = read_request(body, header_length, model, regions)
    if read.sequence is not None:
        return None  # refused by the model, after its rows are validated: the handler's order
    placed = output_regions(read.header, regions)
    decided = services.priority_policy.apply(read.priority, None)
    if decided.clamped_from is not None:
        return None
    strings = check_classified(read.classified, request_rows(read.tensors))
    rows = graph.validate(read.tensors)
    futures = graph.submit_rows(rows, read.wanted, None, decided.priority)
    limit = services.settings.max_response_bytes

    def answer(results: Results) -> tuple[int, Callable[[], Reply]]:
        values = graph.rows_answer(results)
        outputs = {output: values[output] for output in read.wanted}
        return response(model, read, regions, placed, strings, outputs, limit)

    return QueuedInfer(model.name, futures, answer)
