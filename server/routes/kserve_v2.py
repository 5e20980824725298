"""KServe v2 (Open Inference Protocol) over HTTP, through the same batcher as /predict.

What `tritonclient.http` and perf_analyzer use against Triton: health, server and model
metadata, model configuration (Triton's JSON), statistics (Triton's extension), readiness and
`infer` with JSON or binary tensor data (Triton's `binary_tensor_data` extension, tritonclient's
default). Every model is decoded by its signature and inferred alike (a token model is a graph
whose preprocessing is a tokenizer: `ferry.server.kserve.kserve_model`), as in the gRPC service.
Errors use KServe's `{"error": "..."}` shape (`dialects.KSERVE`, declared
for every /v2 route in `route_table.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ferry import __version__
from ferry.server import json_bodies
from ferry.server.call_tenancy import call_priority
from ferry.server.errors import InvalidInput, MalformedRequest
from ferry.server.hot import HotCall, HotRoutes, register
from ferry.server.json_errors import json_error
from ferry.server.kserve import classification
from ferry.server.kserve.extensions import served_extensions
from ferry.server.kserve.infer import ABSENT, request_priority
from ferry.server.kserve.kserve_model import KServeModel
from ferry.server.kserve.lookup import find_model
from ferry.server.kserve.raw_request import RAW_HEADER_LENGTH, raw_request
from ferry.server.kserve.sequence_parameters import sequence_flags
from ferry.server.kserve.shared_memory import SharedMemory, TenantRegions, TensorRef, tensor_ref
from ferry.server.kserve.statistics import model_statistics
from ferry.server.kserve.tensor_codec import (
    decode_tensors,
    parameters,
    tensor_blob,
    tensor_json,
)
from ferry.server.kserve.trace_settings import (
    log_settings,
    trace_settings,
    update_log_settings,
    update_trace_settings,
)
from ferry.server.kserve.versions import VERSION
from ferry.server.large_bodies import LARGE_BODY_BYTES, decoded
from ferry.server.readiness import server_readiness
from ferry.server.replies import JSON, Reply, dumps
from ferry.server.response_size import check_response_size, written
from ferry.server.sequences import SequenceFlags
from ferry.server.services import services_of

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v2", tags=["kserve-v2"])

HEADER_LENGTH = "Inference-Header-Content-Length"
HEADER_LENGTH_KEY = HEADER_LENGTH.lower().encode()  # as ASGI gives header names
NOT_READY_HEADERS = {"Retry-After": "1"}


class KServeError(BaseModel):
    error: str


ERROR_DOCS = {
    400: "Invalid request (JSON, tensor shapes, parameters); the message names the tensor",
    401: "Missing or wrong API key",
    403: "Not allowed to this API key, or off on this server (the message says which)",
    404: "Unknown model",
    413: "Body over max_body_bytes",
    415: "Content-Type neither JSON nor application/octet-stream",
    429: "Queue full (Retry-After)",
    500: "Inference failed",
    503: "Not ready, draining, or backend unavailable (Retry-After)",
    504: "Deadline passed",
}


def error_docs(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": KServeError, "description": ERROR_DOCS[c]} for c in codes}


def _model(request: Request, name: str) -> KServeModel:
    """The model `name`, at the version its path names (`/versions/{version}`), if it does."""
    services = services_of(request)
    version = request.path_params.get("version")
    return find_model(services.registry, services.encoder, name, version)


# -- health and metadata ----------------------------------------------------------------------


# The gateway answers this itself (gateway.py); the route documents it.
LIVE = {"live": True}


@router.get("/health/live")
async def live() -> dict[str, bool]:
    return LIVE


@router.get("/health/ready", responses={503: {"description": "Not ready: `{ready: false}`"}})
async def ready(request: Request) -> JSONResponse:
    ok = (await server_readiness(services_of(request))).ready
    return JSONResponse({"ready": ok}, 200 if ok else 503, None if ok else NOT_READY_HEADERS)


@router.get("")
async def server_metadata(request: Request) -> dict[str, Any]:
    settings = services_of(request).settings
    return {
        "name": settings.kserve_server_name,
        "version": __version__,
        "extensions": list(served_extensions(settings.allow_client_shm)),
    }


@router.get("/models/stats")
async def get_all_statistics(request: Request) -> Response:
    return _statistics(request, None)


@router.get("/models/{name}/stats", responses=error_docs(404))
@router.get("/models/{name}/versions/{version}/stats", include_in_schema=False)
async def get_model_statistics(name: str, request: Request) -> Response:
    return _statistics(request, name)


def _statistics(request: Request, name: str | None) -> Response:
    services = services_of(request)
    every = [*services.registry.encoders, *services.registry.graphs]
    names = every if name is None else [_model(request, name).name]
    return JSONResponse(model_statistics(services.metrics.current(), names))


@router.get("/models/{name}", responses=error_docs(404))
@router.get("/models/{name}/versions/{version}", include_in_schema=False)
async def get_model_metadata(name: str, request: Request) -> Response:
    model = _model(request, name)
    await model.sync_classes()  # another API process's request may have taught it classes
    return JSONResponse(model.metadata())


@router.get("/models/{name}/config", responses=error_docs(404))
@router.get("/models/{name}/versions/{version}/config", include_in_schema=False)
async def get_model_config(name: str, request: Request) -> Response:
    model = _model(request, name)
    await model.sync_classes()
    return JSONResponse(model.config())


@router.get(
    "/models/{name}/ready",
    responses={**error_docs(404), 503: {"description": "Not ready: `{name, ready: false}`"}},
)
@router.get("/models/{name}/versions/{version}/ready", include_in_schema=False)
async def model_ready(name: str, request: Request) -> Response:
    model = _model(request, name)
    ok = not services_of(request).drain.draining and await model.healthy()
    headers = None if ok else NOT_READY_HEADERS
    return JSONResponse({"name": model.name, "ready": ok}, 200 if ok else 503, headers)


# -- trace and log settings (what Ferry can honour of them: kserve/trace_settings.py) --------


@router.get("/trace/setting")
@router.get("/models/{name}/trace/setting", include_in_schema=False)
async def get_trace_settings(request: Request) -> dict[str, Any]:
    _traced_model(request)
    return trace_settings()


@router.post("/trace/setting", responses=error_docs(400, 404))
@router.post("/models/{name}/trace/setting", include_in_schema=False)
async def update_trace(request: Request) -> dict[str, Any]:
    _traced_model(request)
    return update_trace_settings(await _json_body(request))


@router.get("/logging")
async def get_log_settings(request: Request) -> dict[str, Any]:
    return log_settings(services_of(request).settings.log_level)


@router.post("/logging", responses=error_docs(400))
async def update_logging(request: Request) -> dict[str, Any]:
    update = await _json_body(request)
    return update_log_settings(update, services_of(request).settings.log_level)


def _traced_model(request: Request) -> None:
    """A model's trace settings are the server's; the model must be served all the same."""
    name = request.path_params.get("name")
    if name is not None:
        _model(request, name)


async def _json_body(request: Request) -> Any:
    body = await request.body()
    try:
        return orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"request is not valid JSON: {exc}") from None


# -- infer ------------------------------------------------------------------------------------


INFER_PATHS = ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer")


async def infer(call: HotCall) -> Reply:
    """One path for every model: the request decoded by the model's signature (in a worker
    thread when large), checked, then inferred."""
    services = call.services
    name, version = call.params["name"], call.params.get("version")
    model = find_model(services.registry, services.encoder, name, version)
    call.state["model_name"] = model.name
    header_length = call.header(HEADER_LENGTH_KEY)
    length = header_length.decode() if header_length else None
    body, regions = call.body, _regions(call)
    header = None
    if length is None and len(body) >= LARGE_BODY_BYTES:  # all JSON: parsed by a worker
        header = await json_bodies.parsed(body)
    read = await decoded(len(body), partial(read_request, body, length, model, regions, header))
    placed = output_regions(read.header, regions)
    priority = call_priority(call, read.priority)
    strings = check_classified(read.classified, request_rows(read.tensors))
    outputs = await model.infer(
        read.tensors,
        read.wanted,
        priority=priority,
        disconnected=call.disconnected(),
        sequence=read.sequence,
    )
    limit = services.settings.max_response_bytes
    return await written(*response(model, read, regions, placed, strings, outputs, limit))


def response(
    model: KServeModel,
    read: InferRequest,
    regions: TenantRegions,
    placed: dict[str, TensorRef],
    strings: int,
    outputs: dict[str, np.ndarray],
    limit: int,
) -> tuple[int, Callable[[], Reply]]:
    """The answer's size (refused past `limit`, before any is written) and what writes it."""
    classified, binary = read.classified, read.binary
    datatypes = {
        name: "BYTES" if name in classified else model.signature.output(name).datatype
        for name in outputs
    }
    sent = {n: v for n, v in outputs.items() if n not in classified and n not in placed}
    size = check_response_size(sent, limit, binary) + strings * CLASSIFIED_BYTES
    answer = Answer(
        model.name, read.header.get("id"), binary, datatypes, classified, regions, placed
    )
    return size, partial(_answer, answer, outputs)


def _regions(call: HotCall) -> TenantRegions:
    memory: SharedMemory = call.services.shared_memory
    return memory.of(call.state.get("tenant"))


def output_regions(header: dict[str, Any], regions: TenantRegions) -> dict[str, TensorRef]:
    """The outputs to write into shared memory regions (their names checked already), each
    region and range checked before any work."""
    placed = {}
    for spec in header.get("outputs") or []:
        ref = tensor_ref(str(spec.get("name")), parameters(spec))
        if ref is not None:
            placed[spec["name"]] = ref
    regions.check(placed)
    return placed


# Top-k strings ("value:index:label") one request may ask for, k times its rows: each is
# formatted in Python, ~1.5 us apiece (issue 48: k = 1000 over 2048 rows held the loop 3-5 s).
MAX_CLASSIFIED = 65_536
CLASSIFIED_BYTES = 32  # a string's bytes in the answer, about


def check_classified(plans: dict[str, classification.Classification], rows: int) -> int:
    """The top-k strings the request asks for, refused past MAX_CLASSIFIED before any work,
    naming the output."""
    total = 0
    for name, plan in plans.items():
        strings = plan.count * (rows if plan.batched else 1)
        total += strings
        if total > MAX_CLASSIFIED:
            raise InvalidInput(
                name,
                f"classification {plan.count} over {rows} rows is {total} strings with the "
                f"outputs before it; at most {MAX_CLASSIFIED} per request (ask for a smaller k "
                "or send fewer rows)",
            )
    return total


def request_rows(tensors: dict[str, np.ndarray]) -> int:
    """The request's rows: the first axis of its inputs (the largest, if they differ)."""
    return max((int(t.shape[0]) for t in tensors.values() if t.ndim), default=1)


@dataclass(frozen=True)
class Answer:
    """How a request's outputs go back: binary or JSON, classified, or into regions."""

    model: str
    request_id: Any
    binary: set[str]
    datatypes: dict[str, str]  # by output
    classified: dict[str, classification.Classification]
    regions: TenantRegions
    placed: dict[str, TensorRef]  # outputs written into shared memory regions


def _answer(answer: Answer, outputs: dict[str, np.ndarray]) -> Reply:
    """Classified, placed, then written: off the loop for a large answer."""
    outputs = classification.apply(outputs, answer.classified)
    for name, ref in answer.placed.items():
        answer.regions.write(ref, tensor_blob(outputs[name], answer.datatypes[name]), name)
    return encode_response(
        answer.model, answer.request_id, outputs, answer.binary, answer.datatypes, answer.placed
    )


class InferRequest(NamedTuple):
    """A request read and checked."""

    header: dict[str, Any]
    tensors: dict[str, np.ndarray]
    wanted: tuple[str, ...]  # its outputs
    binary: set[str]  # those sent as binary
    classified: dict[str, classification.Classification]
    priority: int  # parameters.priority, before the priority policy
    sequence: SequenceFlags | None


def read_request(
    body: bytes,
    header_length: str | None,
    model: KServeModel,
    regions: TenantRegions,
    parsed: dict[str, Any] | None = None,
) -> InferRequest:
    """A request read and checked in one go (one hop to a worker thread for a large body): its
    header, tensors (decoded by the model's signature), outputs, binary outputs and
    classifications. `parsed`: the all-JSON body as json_bodies.py parsed it."""
    if header_length == RAW_HEADER_LENGTH:  # Triton's raw form: the body is the one input
        header, body = raw_request(model, body)
        size = 0
    elif parsed is not None:
        header, size = parsed, len(body)
    else:
        header, size = read_header(body, header_length)
    if _without_parameters(header):  # nothing to read but the output names
        wanted = model.output_names([spec["name"] for spec in header.get("outputs") or ()])
        binary: set[str] = set()
        classified: dict[str, classification.Classification] = {}
        priority, sequence = 0, None
    else:
        wanted, binary = requested_outputs(header, model)
        classified = classifications(header, model)
        priority = request_priority(parameters(header).get("priority", ABSENT))
        sequence = http_sequence(header)
    tensors = decode_tensors(header, body, size, model.signature, regions)
    for spec in header["inputs"]:
        # Freed here, not on the event loop when the request ends: an image's 150,528 float
        # objects take ~1 ms to free.
        spec.pop("data", None)
    return InferRequest(header, tensors, wanted, binary, classified, priority, sequence)


def _without_parameters(header: dict[str, Any]) -> bool:
    """No parameters on the request or its outputs, each output spec a bare {"name": ...}: the
    form most clients send, whose binary outputs, top-k, priority and sequence are all their
    defaults (read the general way, it costs a third of the request's reading)."""
    if "parameters" in header:
        return False
    outputs = header.get("outputs")
    if outputs is None:
        return True
    if type(outputs) is not list:
        return False
    return all(type(spec) is dict and len(spec) == 1 and "name" in spec for spec in outputs)


def http_sequence(header: dict[str, Any]) -> SequenceFlags | None:
    """The request's sequence parameters (server/kserve/sequence_parameters.py)."""
    sent = parameters(header)
    return sequence_flags(lambda name: sent.get(name, ABSENT))


def register_routes(router: APIRouter, hot: HotRoutes) -> None:
    for path in INFER_PATHS:
        register(
            router,
            hot,
            path,
            infer,
            summary="Infer",
            responses=error_docs(400, 404, 415, 429, 500, 503, 504),
            include_in_schema="version" not in path,
            tags=["kserve-v2"],
        )


def read_header(body: bytes, header_length: str | None) -> tuple[dict[str, Any], int]:
    """The JSON header, checked to be an object with an inputs list, and where it ends."""
    size = len(body) if header_length is None else _header_length(header_length, len(body))
    try:
        # orjson: bounded nesting depth, and no lone surrogates in strings.
        header = orjson.loads(body[:size])
    except (ValueError, UnicodeDecodeError) as exc:
        field, message = json_error(body[:size], str(exc))
        raise MalformedRequest(f"request is not valid JSON: {message}", field) from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise MalformedRequest("request must be an object with an 'inputs' list")
    return header, size


def _header_length(value: str, body_size: int) -> int:
    if not value.isdigit() or int(value) > body_size:
        raise MalformedRequest(
            f"must be the byte length of the JSON header, 0 to {body_size}; got {value[:40]!r}",
            HEADER_LENGTH,
        )
    return int(value)


def requested_outputs(
    header: dict[str, Any], model: KServeModel
) -> tuple[tuple[str, ...], set[str]]:
    """Output names (all of the backend's when none are asked for) and those to send binary."""
    all_binary = bool(parameters(header).get("binary_data_output", False))
    specs = header.get("outputs") or []
    if not isinstance(specs, list):
        raise MalformedRequest("'outputs' must be a list of {name} objects")
    names: list[Any] = []  # raw JSON names: output_names checks them
    binary: list[bool] = []
    for spec in specs:
        if not isinstance(spec, dict):  # e.g. [null]: refused, not read as a dict
            raise MalformedRequest("'outputs' must be a list of {name} objects", "outputs")
        names.append(spec.get("name"))
        binary.append(all_binary or bool(parameters(spec).get("binary_data", False)))
    checked = model.output_names(names)
    if not specs:
        return checked, set(checked) if all_binary else set()
    # Only checked names go in a set (a name of [] is not hashable).
    return checked, {name for name, wanted in zip(checked, binary, strict=True) if wanted}


def classifications(
    header: dict[str, Any], model: KServeModel
) -> dict[str, classification.Classification]:
    """The outputs asked for as Triton's top-k classes (their specs checked already)."""
    specs = header.get("outputs") or []
    asked = ((s.get("name"), parameters(s).get(classification.PARAMETER)) for s in specs)
    return classification.plan(model, classification.requested(asked))


def encode_response(
    model: str,
    request_id: Any,
    outputs: dict[str, np.ndarray],
    binary: set[str],
    datatypes: dict[str, str],  # by output
    in_regions: Collection[str] = (),  # outputs written into regions: no data here
) -> Reply:
    entries, blobs = [], []
    for name, value in outputs.items():
        datatype = datatypes[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(value.shape)}
        if name in in_regions:
            pass  # its data is in the client's region
        elif name in binary:
            blob = tensor_blob(value, datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = tensor_json(value, datatype)
        entries.append(entry)
    header: dict[str, Any] = {"model_name": model, "model_version": VERSION, "outputs": entries}
    if request_id is not None:
        header["id"] = request_id
    head = dumps(header)
    if not blobs:
        return Reply(200, head, JSON)
    return Reply(
        200,
        head + b"".join(blobs),
        b"application/octet-stream",
        ((HEADER_LENGTH_KEY, str(len(head)).encode()),),
    )
