"""KServe v2 over gRPC: `inference.GRPCInferenceService`, the proto tritonclient ships.

Runs on `grpc_port` in the server's own event loop, so it shares the HTTP side's models,
batchers, drain and metrics; inference is `ferry.server.kserve.infer.infer_tensors`, the function
the HTTP route calls. Tensors arrive as typed contents or raw little-endian bytes (tritonclient's
default); outputs always go back raw, as Triton sends them. Errors map from Ferry's one error
table to gRPC status codes. Each call is declared in `route_table.py` (its class and whether it
needs the key) and goes through the HTTP gateway's key, drain and metrics code
(`route_policy.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from ferry import __version__
from ferry.server.dialects import kserve_message
from ferry.server.encoder_model import EncoderModel
from ferry.server.errors import Failure, InvalidInput, failure
from ferry.server.graph_model import GraphModel, is_graph, prepare
from ferry.server.kserve import classification
from ferry.server.kserve.extensions import SERVED as EXTENSIONS
from ferry.server.kserve.infer import (
    ABSENT,
    deserialize_bytes,
    infer_tensors,
    output_names,
    request_priority,
)
from ferry.server.kserve.model_config import model_config, model_metadata
from ferry.server.kserve.statistics import model_statistics
from ferry.server.kserve.tensor_codec import (
    check_raw_alone,
    checked_shape,
    decode_grpc_tensors,
    tensor_blob,
)
from ferry.server.kserve.versions import VERSION, find_model
from ferry.server.model_repository import check_tenant_right, load_parameters, unload_parameters
from ferry.server.request_ids import bind_grpc
from ferry.server.route_policy import RoutePolicy, endpoint_label, record_request
from ferry.server.route_table import GRPC_ROUTES, RouteClass
from ferry.server.tenancy import CLAMPED_HEADER

logger = logging.getLogger(__name__)

# Every status of the error table (the HTTP-only ones too, for completeness).
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    431: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
INT_TYPES = {"INT64": ("<i8", "int64_contents"), "INT32": ("<i4", "int_contents")}


def grpc_status(failure: Failure) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """The gRPC dialect of the one table: a status code, KServe's message and, where a retry
    can succeed, `retry-after` in the trailing metadata."""
    code = STATUS_CODES.get(failure.status, grpc.StatusCode.INTERNAL)
    trailers = (("retry-after", "1"),) if failure.retry_after_s is not None else ()
    return code, kserve_message(failure), trailers


CONTENTS_FIELD = {"BYTES": "bytes_contents", **{k: f for k, (_, f) in INT_TYPES.items()}}


def check_contents(tensor: Any) -> None:
    """Typed contents only in the field of the tensor's datatype (Triton's rule): INT64 data
    sent as fp32_contents or bool_contents is refused, not read as an empty tensor."""
    used = [field.name for field, _ in tensor.contents.ListFields()]
    expected = CONTENTS_FIELD[tensor.datatype]
    wrong = [f for f in used if f != expected]
    if wrong:
        raise InvalidInput(
            tensor.name, f"{tensor.datatype} data goes in contents.{expected}, got {wrong[0]}"
        )


def decode_inputs(request: service_pb2.ModelInferRequest) -> dict[str, np.ndarray]:
    raw = list(request.raw_input_contents)
    check_raw_alone(request)
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput("raw_input_contents", "one raw content per input is required")
    tensors = {}
    room = request.ByteSize()
    for index, tensor in enumerate(request.inputs):
        name, shape = tensor.name, checked_shape(tensor.name, list(tensor.shape), room)
        if tensor.datatype != "BYTES" and tensor.datatype not in INT_TYPES:
            raise InvalidInput(
                name, f"datatype must be INT64 (token ids) or BYTES (text), got {tensor.datatype}"
            )
        check_contents(tensor)
        if tensor.datatype == "BYTES":
            array = (
                deserialize_bytes(raw[index], name)
                if raw
                else np.array(list(tensor.contents.bytes_contents), dtype=object)
            )
        else:
            dtype, field = INT_TYPES[tensor.datatype]
            if raw and len(raw[index]) % np.dtype(dtype).itemsize:
                message = f"{len(raw[index])} raw bytes are not whole {tensor.datatype} values"
                raise InvalidInput(name, message)
            array = (
                np.frombuffer(raw[index], dtype=dtype)
                if raw
                else np.asarray(getattr(tensor.contents, field), dtype=np.int64)
            )
        try:
            array = array.reshape(shape)
        except ValueError:
            raise InvalidInput(name, f"{array.size} values do not fit shape {shape}") from None
        tensors[name] = array if tensor.datatype == "BYTES" else array.astype(np.int64)
    return tensors


def encode_outputs(
    request: service_pb2.ModelInferRequest,
    outputs: dict[str, np.ndarray],
    datatypes: dict[str, str],  # by output
) -> service_pb2.ModelInferResponse:
    """Outputs raw, as Triton sends them (little-endian; BYTES length-prefixed)."""
    response = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=VERSION, id=request.id
    )
    for name, value in outputs.items():
        response.outputs.add(name=name, datatype=datatypes[name], shape=list(value.shape))
        response.raw_output_contents.append(tensor_blob(value, datatypes[name]))
    return response


def classifications(
    request: service_pb2.ModelInferRequest, model: EncoderModel | GraphModel
) -> dict[str, classification.Classification]:
    """The outputs asked for as Triton's top-k classes (tritonclient's `class_count`)."""
    asked = ((o.name, _parameter(o.parameters, classification.PARAMETER)) for o in request.outputs)
    counts = classification.requested((n, None if v is ABSENT else v) for n, v in asked)
    return classification.plan(model, counts)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]  # generated, untyped base
    def __init__(self, state: Any) -> None:
        self.state = state  # the FastAPI app's state: registry, settings, drain, metrics
        self._policy = RoutePolicy(state.settings, state.drain)

    async def _call(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        handler: Callable[[str | None], Awaitable[Any]],
        model_name: str = "",
    ) -> Any:
        """The HTTP gateway's key, drain and metrics around one call (by its declaration in the
        route table), then the error mapping; `handler` gets the caller's tenant."""
        bind_grpc(context)  # the request id: for this call's log lines, in its trailing metadata
        route = GRPC_ROUTES[method]
        started, status, counted = time.perf_counter(), 200, False
        drain = self.state.drain
        try:
            tenant = self._policy.tenant(route, lambda: _authorization(context))
            counted = self._policy.admit(route)
            if counted:
                drain.enter()
            return await handler(tenant)
        except asyncio.CancelledError:
            status = 499
            raise
        except Exception as exc:
            error = failure(exc, route.path)
            status = error.status
            code, details, trailers = grpc_status(error)
            if trailers:
                context.set_trailing_metadata((*context.trailing_metadata(), *trailers))
            await context.abort(code, details)
        finally:
            if counted:
                drain.leave()
            # As on HTTP, only inference is labelled with its model (statistics count those), and
            # only served names become label values (bounded series).
            registry = self.state.registry
            served = route.kind is RouteClass.INFERENCE and (
                model_name in registry.models or model_name in registry.tensors
            )
            model = model_name if served else ""
            record_request(self.state.metrics, model, endpoint_label(route), status, started)

    def _ready(self) -> Awaitable[bool]:
        async def check() -> bool:
            return not self.state.drain.draining and await self.state.registry.ready()

        return check()

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._call(
            "ServerLive", context, lambda _: _value(service_pb2.ServerLiveResponse(live=True))
        )

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            return service_pb2.ServerReadyResponse(ready=await self._ready())

        return await self._call("ServerReady", context, run)

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            registry, name = self.state.registry, request.name
            if name in self.state.repository.entries and name not in registry.tensors.keys() | (
                registry.models.keys()
            ):  # not loaded (Triton answers not ready, no error), or an LLM
                ready = registry.readiness().get(name, False)
                return service_pb2.ModelReadyResponse(ready=ready and not self.state.drain.draining)
            model = find_model(registry, name, request.version)
            ok = not self.state.drain.draining and await model.healthy()
            return service_pb2.ModelReadyResponse(ready=ok)

        return await self._call("ModelReady", context, run, request.name)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = service_pb2.ServerMetadataResponse(
            name=self.state.settings.kserve_server_name,
            version=__version__,
            extensions=EXTENSIONS,
        )
        return await self._call("ServerMetadata", context, lambda _: _value(response))

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            model = find_model(self.state.registry, request.name, request.version)
            metadata = model_metadata(model)
            # The proto has no place for a ZipMap output's classes (HTTP lists them).
            response = service_pb2.ModelMetadataResponse()
            return json_format.ParseDict(metadata, response, ignore_unknown_fields=True)

        return await self._call("ModelMetadata", context, run, request.name)

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            config = model_config(find_model(self.state.registry, request.name, request.version))
            parsed = json_format.ParseDict(config, model_config_pb2.ModelConfig())
            return service_pb2.ModelConfigResponse(config=parsed)

        return await self._call("ModelConfig", context, run, request.name)

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            registry = self.state.registry
            every = [*registry.models, *registry.tensors]
            names = (
                [find_model(registry, request.name, request.version).name]
                if request.name
                else every
            )
            stats = model_statistics(self.state.metrics.registry, names)
            return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())

        return await self._call("ModelStatistics", context, run, request.name)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(tenant: str | None) -> Any:
            model = find_model(self.state.registry, request.model_name, request.model_version)
            asked = request_priority(_parameter(request.parameters, "priority"))
            decided = self.state.priority_policy.apply(asked, tenant)
            if decided.clamped_from is not None:  # said, as the HTTP header says it
                clamped = (CLAMPED_HEADER.decode(), str(decided.clamped_from))
                context.set_trailing_metadata((*context.trailing_metadata(), clamped))
            if is_graph(model):
                return await infer_plain(model, request, decided.priority)
            wanted = output_names(model, [o.name for o in request.outputs])
            classified = classifications(request, model)
            # A cancelled call (client gone) cancels this task, and with it the queued work.
            outputs = await infer_tensors(
                model,
                self.state.encoder,
                decode_inputs(request),
                wanted,
                priority=decided.priority,
            )
            datatypes = {name: "BYTES" if name in classified else "FP32" for name in outputs}
            return encode_outputs(request, classification.apply(outputs, classified), datatypes)

        return await self._call("ModelInfer", context, run, request.model_name)

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            _check_repository(request.repository_name)
            entries = await self.state.repository.index(request.ready)
            models = [
                service_pb2.RepositoryIndexResponse.ModelIndex(**e.as_json()) for e in entries
            ]
            return service_pb2.RepositoryIndexResponse(models=models)

        return await self._call("RepositoryIndex", context, run)

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(tenant: str | None) -> Any:
            check_tenant_right(self.state.settings, tenant)
            _check_repository(request.repository_name)
            name = request.model_name
            config, files = load_parameters(name, _repository_parameters(request.parameters))
            await self.state.repository.load(name, config, files)
            return service_pb2.RepositoryModelLoadResponse()

        return await self._call("RepositoryModelLoad", context, run)

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(tenant: str | None) -> Any:
            check_tenant_right(self.state.settings, tenant)
            _check_repository(request.repository_name)
            name = request.model_name
            dependents = unload_parameters(name, _repository_parameters(request.parameters))
            await self.state.repository.unload(name, dependents)
            return service_pb2.RepositoryModelUnloadResponse()

        return await self._call("RepositoryModelUnload", context, run)


def _check_repository(name: str) -> None:
    """Ferry has one repository (its config's models): a request naming another is refused."""
    if name:
        raise InvalidInput(
            "repository_name", f"Ferry has one model repository, not {name!r}: send none"
        )


def _repository_parameters(parameters: Any) -> dict[str, Any]:
    """A ModelRepositoryParameter map as the HTTP route's JSON parameters."""
    values = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        values[key] = None if choice is None else getattr(parameter, choice)
    return values


async def infer_plain(
    model: GraphModel, request: Any, priority: int
) -> service_pb2.ModelInferResponse:
    """A plain graph: its own inputs and datatypes, outputs raw in the graph's datatypes;
    `priority` after the policy (server/tenancy.py)."""
    wanted = output_names(model, [o.name for o in request.outputs])
    classified = classifications(request, model)
    rows = await prepare(model, decode_grpc_tensors(request, model.signature))
    result = await model.infer(rows, wanted, priority=priority)
    outputs = classification.apply({name: result[name] for name in wanted}, classified)
    datatypes = {
        name: "BYTES" if name in classified else model.signature.output(name).datatype
        for name in wanted
    }
    return encode_outputs(request, outputs, datatypes)


def _parameter(parameters: Any, name: str) -> Any:
    """A request parameter's value (whichever of InferParameter's fields it was sent in);
    ABSENT when not sent, None when sent without a value."""
    if name not in parameters:
        return ABSENT
    choice = parameters[name].WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameters[name], choice)


async def _value(value: Any) -> Any:
    return value


def _authorization(context: grpc.aio.ServicerContext) -> list[bytes]:
    """Every `authorization` value of the call's metadata (two are refused, as on HTTP)."""
    metadata = context.invocation_metadata() or ()
    return [str(value).encode() for name, value in metadata if name == "authorization"]


def answer_unsupported_calls(servicer: InferenceServicer) -> None:
    """Each call of the service Ferry does not serve answers UNIMPLEMENTED, naming it, with one
    log line: the generated base raises NotImplementedError, which grpc logs with a traceback
    on every call."""
    base = service_pb2_grpc.GRPCInferenceServiceServicer
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        if getattr(type(servicer), method.name) is getattr(base, method.name):
            setattr(servicer, method.name, _unsupported(method.name))


def _unsupported(name: str) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        logger.info("gRPC %s is not supported by Ferry: answered UNIMPLEMENTED", name)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not supported by Ferry")

    return refuse


async def start_grpc_server(
    state: Any, host: str, port: int, max_message_bytes: int
) -> grpc.aio.Server:
    """Bind and start; the caller stops it (`await server.stop(grace)`) at shutdown."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
        ]
    )
    servicer = InferenceServicer(state)
    answer_unsupported_calls(servicer)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot bind the gRPC port {host}:{port}")
    await server.start()
    logger.info("ferry: KServe v2 gRPC on %s:%d", host, port)
    return server
