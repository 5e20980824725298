"""KServe v2 (Open Inference Protocol) over HTTP, through the same batcher as /predict.

Enough of the protocol for `tritonclient.http` to point at Ferry unchanged: health, server and
model metadata, model readiness and `infer` with JSON or binary tensor data (Triton's
`binary_tensor_data` extension, which tritonclient uses by default). `input_ids` (and optionally
`attention_mask`) are INT64 [batch, seq]; each row is queued as its own sequence, cut to its
mask's real length, so the batcher batches it with any other traffic. Outputs are FP32, sequence
outputs padded back to the request's width. Errors use KServe's `{"error": "..."}` shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from ferry.batcher import TokenSequence
from ferry.batcher.errors import InvalidInput
from ferry.server.encoder import EncoderInputs
from ferry.server.errors import MalformedRequest, error_response
from ferry.server.hot import JSON, HotCall, HotRoutes, Reply, as_route, dumps
from ferry.server.model_runtime import ModelRuntime
from pydantic import BaseModel

router = APIRouter(prefix="/v2", tags=["kserve-v2"])

HEADER_LENGTH = "Inference-Header-Content-Length"
VERSION = "1"
INT_TYPES = {"INT64": np.int64, "INT32": np.int32}


class KServeError(BaseModel):
    error: str


ERROR_DOCS = {
    400: "Not a KServe v2 request (JSON, tensor shapes)",
    404: "Unknown model",
    422: "Invalid input; the message names the tensor",
    429: "Queue full",
    500: "Inference failed",
    503: "Not ready, draining, or backend unavailable",
    504: "Deadline passed",
}


def error_docs(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": KServeError, "description": ERROR_DOCS[c]} for c in codes}


def kserve_error(exc: BaseException, request: Request) -> Response:
    """The status from Ferry's one error table; the body in KServe's shape (by the path)."""
    return error_response(exc, request.url.path)


# -- health and metadata ----------------------------------------------------------------------


@router.get("/health/live")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/health/ready", responses={503: {"description": "Not ready: `{ready: false}`"}})
async def ready(request: Request) -> JSONResponse:
    state = request.app.state
    ok = not state.drain.draining and await state.registry.ready()
    return JSONResponse({"ready": ok}, 200 if ok else 503)


@router.get("")
async def server_metadata() -> dict[str, Any]:
    return {"name": "ferry", "version": "0.1.0", "extensions": ["binary_tensor_data"]}


@router.get("/models/{name}", responses=error_docs(404))
@router.get("/models/{name}/versions/{version}", include_in_schema=False)
async def model_metadata(name: str, request: Request) -> Response:
    try:
        model = request.app.state.registry.get(name)
    except Exception as exc:
        return kserve_error(exc, request)
    backend = model.backend
    # Only the axes Ferry knows are given sizes; the rest vary (-1), as the protocol allows.
    outputs = [
        {"name": n, "datatype": "FP32", "shape": [-1] * (3 if n in backend.sequence_outputs else 2)}
        for n in backend.output_names
    ]
    tensor = {"datatype": "INT64", "shape": [-1, -1]}
    return JSONResponse(
        {
            "name": model.name,
            "versions": [VERSION],
            "platform": f"ferry_{backend.name}",
            "inputs": [{"name": "input_ids", **tensor}, {"name": "attention_mask", **tensor}],
            "outputs": outputs,
        }
    )


@router.get(
    "/models/{name}/ready",
    responses={**error_docs(404), 503: {"description": "Not ready: `{name, ready: false}`"}},
)
@router.get("/models/{name}/versions/{version}/ready", include_in_schema=False)
async def model_ready(name: str, request: Request) -> Response:
    try:
        model = request.app.state.registry.get(name)
    except Exception as exc:
        return kserve_error(exc, request)
    ok = not request.app.state.drain.draining and await model.healthy()
    return JSONResponse({"name": model.name, "ready": ok}, 200 if ok else 503)


# -- infer ------------------------------------------------------------------------------------


INFER_PATHS = ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer")


async def infer(call: HotCall) -> Reply:
    name = call.path.split("/")[3]
    model = call.app_state.registry.get(name)
    call.state["model_name"] = model.name
    header_length = call.header(HEADER_LENGTH.lower().encode())
    header, tensors = decode_request(call.body, header_length.decode() if header_length else None)
    ids, mask = input_arrays(tensors)
    wanted, binary = requested_outputs(header, model)
    result = await call.app_state.encoder.run(
        model, EncoderInputs(sequences=row_sequences(ids, mask)), wanted, None, call.disconnected()
    )
    sequence = model.backend.sequence_outputs
    outputs = {
        n: stack_rows([r[n] for r in result.rows], ids.shape[1] if n in sequence else None)
        for n in wanted
    }
    return encode_response(model.name, header.get("id"), outputs, binary)


def register(router: APIRouter, hot: HotRoutes) -> None:
    for path in INFER_PATHS:
        route = hot.add("POST", path, infer)
        router.add_api_route(
            path.removeprefix("/v2"),
            as_route(route),
            methods=["POST"],
            responses=error_docs(400, 404, 422, 429, 500, 503, 504),
            include_in_schema="version" not in path,
            summary="Infer",
        )


def decode_request(body: bytes, header_length: str | None) -> tuple[dict, dict[str, np.ndarray]]:
    """JSON header (+ binary tail) -> the header and each input as an array of its shape."""
    try:
        size = int(header_length) if header_length is not None else len(body)
        # orjson: bounded nesting depth, and no lone surrogates in strings.
        header = orjson.loads(body[:size])
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"request is not valid JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise MalformedRequest("request must be an object with an 'inputs' list")
    tensors: dict[str, np.ndarray] = {}
    offset = size
    for spec in header["inputs"]:
        try:
            name, shape, datatype = spec["name"], [int(d) for d in spec["shape"]], spec["datatype"]
        except (KeyError, TypeError, ValueError):
            raise MalformedRequest("each input needs 'name', 'shape' and 'datatype'") from None
        if datatype not in INT_TYPES:
            raise InvalidInput(name, f"datatype must be INT64, got {datatype}")
        dtype = INT_TYPES[datatype]
        binary_size = parameters(spec).get("binary_data_size")
        try:
            if binary_size is not None:
                chunk = body[offset : offset + int(binary_size)]
                offset += int(binary_size)
                array = np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<"))
            else:
                array = np.asarray(spec["data"], dtype=dtype)
            tensors[name] = array.reshape(shape).astype(np.int64)
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            raise InvalidInput(name, f"data does not fit shape {shape}: {exc}") from None
    return header, tensors


def parameters(entry: dict) -> dict:
    value = entry.get("parameters") or {}
    if not isinstance(value, dict):
        raise MalformedRequest("'parameters' must be an object")
    return value


def input_arrays(tensors: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    unknown = set(tensors) - {"input_ids", "attention_mask"}
    if unknown:
        raise InvalidInput(sorted(unknown)[0], "inputs are input_ids and attention_mask only")
    if "input_ids" not in tensors:
        raise InvalidInput("input_ids", "input_ids is required")
    ids = tensors["input_ids"]
    mask = tensors.get("attention_mask", np.ones_like(ids))
    if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise InvalidInput("input_ids", f"input_ids must be [batch, seq], got {list(ids.shape)}")
    if mask.shape != ids.shape:
        raise InvalidInput(
            "attention_mask", f"shape {list(mask.shape)} differs from input_ids {list(ids.shape)}"
        )
    return ids, mask


def row_sequences(ids: np.ndarray, mask: np.ndarray) -> list[TokenSequence]:
    """Each row cut after its mask's last 1, so right-padding never reaches the batcher."""
    sequences = []
    for row_ids, row_mask in zip(ids, mask, strict=True):
        kept = np.flatnonzero(row_mask)
        # An all-zero mask is kept whole so that the batcher's validation names the problem.
        length = int(kept[-1]) + 1 if kept.size else row_ids.shape[0]
        sequences.append(TokenSequence(row_ids[:length].copy(), row_mask[:length].copy()))
    return sequences


def requested_outputs(header: dict, model: ModelRuntime) -> tuple[list[str], set[str]]:
    """Output names (all of the backend's when none are asked for) and those to send binary."""
    available = model.backend.output_names
    all_binary = bool(parameters(header).get("binary_data_output", False))
    specs = header.get("outputs") or [{"name": n} for n in available]
    if not isinstance(specs, list):
        raise MalformedRequest("'outputs' must be a list of {name} objects")
    names, binary = [], set()
    for spec in specs:
        name = spec.get("name") if isinstance(spec, dict) else None
        if name not in available:
            raise InvalidInput("outputs", f"unknown output {name!r}; choose from {list(available)}")
        names.append(name)
        if all_binary or parameters(spec).get("binary_data", False):
            binary.add(name)
    return names, binary


def stack_rows(parts: list[np.ndarray], width: int | None) -> np.ndarray:
    """Per-row outputs into one FP32 tensor; sequence outputs padded back to `width`."""
    if width is not None:
        parts = [np.pad(p, [(0, width - p.shape[0])] + [(0, 0)] * (p.ndim - 1)) for p in parts]
    return np.stack(parts).astype(np.float32)


def encode_response(
    model: str, request_id: Any, outputs: dict[str, np.ndarray], binary: set[str]
) -> Reply:
    entries, blobs = [], []
    for name, value in outputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": list(value.shape)}
        if name in binary:
            blob = value.astype("<f4").tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = value.ravel()
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
        ((HEADER_LENGTH.lower().encode(), str(len(head)).encode()),),
    )
