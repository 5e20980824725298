"""KServe v2 over gRPC: `inference.GRPCInferenceService`, the proto tritonclient ships.

Runs on `grpc_port` in the server's own event loop, so it shares the HTTP side's models,
batchers, drain and metrics; a request is decoded by its model's signature and inferred as the
HTTP route does it (`ferry.server.kserve.kserve_model`). Tensors arrive as typed contents or raw
little-endian bytes (tritonclient's default); outputs always go back raw, as Triton sends them.
Errors map from Ferry's one error table to gRPC status codes. Each call is declared in
`route_table.py` (its class and whether it needs the key) and goes through the HTTP gateway's
key, drain and metrics code (`route_policy.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from ferry import __version__
from ferry.batcher import tracing as batcher_tracing
from ferry.server import tracing
from ferry.server.dialects import kserve_message
from ferry.server.errors import NOT_SUPPORTED, Failure, InvalidInput, NotSupported, failure
from ferry.server.kserve import classification
from ferry.server.kserve.extensions import served_extensions
from ferry.server.kserve.infer import ABSENT, request_priority
from ferry.server.kserve.kserve_model import KServeModel
from ferry.server.kserve.lookup import find_model
from ferry.server.kserve.sequence_parameters import sequence_flags
from ferry.server.kserve.shared_memory import (
    CUDA_UNSUPPORTED,
    TenantRegions,
    TensorRef,
    tensor_ref,
)
from ferry.server.kserve.statistics import model_statistics
from ferry.server.kserve.tensor_codec import (
    decode_grpc_tensors,
    proto_parameters,
    tensor_blob,
)
from ferry.server.kserve.versions import VERSION
from ferry.server.model_repository import check_tenant_right, load_parameters, unload_parameters
from ferry.server.readiness import server_readiness
from ferry.server.request_ids import bind_grpc
from ferry.server.route_policy import RoutePolicy, endpoint_label, record_request
from ferry.server.route_table import GRPC_ROUTES, RouteClass
from ferry.server.services import Services
from ferry.server.tenancy import CLAMPED_HEADER

if TYPE_CHECKING:
    from ferry.server.otel_tracing import ServerSpan, Tracing

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
SERVICE = "inference.GRPCInferenceService"


def grpc_status(failure: Failure) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """The gRPC dialect of the one table: a status code, KServe's message and, where a retry
    can succeed, `retry-after` in the trailing metadata."""
    code = STATUS_CODES.get(failure.status, grpc.StatusCode.INTERNAL)
    if failure.type == NOT_SUPPORTED:
        code = grpc.StatusCode.UNIMPLEMENTED
    trailers = (("retry-after", "1"),) if failure.retry_after_s is not None else ()
    return code, kserve_message(failure), trailers


def encode_outputs(
    request: service_pb2.ModelInferRequest,
    outputs: dict[str, np.ndarray],
    datatypes: dict[str, str],  # by output
    regions: TenantRegions,
    placed: dict[str, TensorRef],  # outputs to write into shared memory regions
) -> service_pb2.ModelInferResponse:
    """Outputs raw, as Triton sends them (little-endian; BYTES length-prefixed), or written
    into their regions (an empty raw content keeps the others' places, as in Triton)."""
    response = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=VERSION, id=request.id
    )
    for name, value in outputs.items():
        response.outputs.add(name=name, datatype=datatypes[name], shape=list(value.shape))
        blob = tensor_blob(value, datatypes[name])
        if name in placed:
            regions.write(placed[name], blob, name)
            blob = b""
        response.raw_output_contents.append(blob)
    return response


def output_regions(
    request: service_pb2.ModelInferRequest, regions: TenantRegions
) -> dict[str, TensorRef]:
    """The outputs asked for in shared memory regions, their regions checked before any work."""
    placed = {}
    for output in request.outputs:
        ref = tensor_ref(output.name, proto_parameters(output.parameters))
        if ref is not None:
            placed[output.name] = ref
    regions.check(placed)
    return placed


def classifications(
    request: service_pb2.ModelInferRequest, model: KServeModel
) -> dict[str, classification.Classification]:
    """The outputs asked for as Triton's top-k classes (tritonclient's `class_count`)."""
    asked = ((o.name, _parameter(o.parameters, classification.PARAMETER)) for o in request.outputs)
    counts = classification.requested((n, None if v is ABSENT else v) for n, v in asked)
    return classification.plan(model, counts)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]  # generated, untyped base
    def __init__(self, services: Services) -> None:
        self.services = services  # the app's: registry, settings, drain, metrics (services.py)
        self._policy = RoutePolicy(services.settings, services.drain)

    async def _call(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        handler: Callable[[str | None], Awaitable[Any]],
        model_name: str = "",
    ) -> Any:
        """`_guarded`, its failure aborting the call with its status code."""
        outcome = await self._guarded(method, context, handler, model_name)
        if isinstance(outcome, Failure):
            code, details, trailers = grpc_status(outcome)
            if trailers:
                context.set_trailing_metadata((*context.trailing_metadata(), *trailers))
            await context.abort(code, details)
        return outcome

    async def _guarded(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        handler: Callable[[str | None], Awaitable[Any]],
        model_name: str = "",
    ) -> Any:
        """The HTTP gateway's key, drain and metrics around one call (by its declaration in the
        route table); `handler` gets the caller's tenant. Its answer, or the Failure it raised."""
        request_id = bind_grpc(context)  # for its log lines, in its trailing metadata
        route = GRPC_ROUTES[method]
        started, status, counted = time.perf_counter(), 200, False
        drain = self.services.drain
        server_span = None
        if self.services.tracing is not None:
            server_span = _server_span(self.services.tracing, method, context, request_id)
            traced = batcher_tracing.current.set(server_span.request)
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
            return error
        finally:
            if counted:
                drain.leave()
            # As on HTTP, only inference is labelled with its model (statistics count those), and
            # only served names become label values (bounded series).
            registry = self.services.registry
            served = route.kind is RouteClass.INFERENCE and (
                model_name in registry.encoders or model_name in registry.graphs
            )
            model = model_name if served else ""
            trace_id = None
            if server_span is not None:
                trace_id = server_span.trace_id()
                finished: dict[str, str | int] = {"rpc.grpc.status_code": _code(status).value[0]}
                if model:
                    finished["ferry.model"] = model
                server_span.finish(f"{SERVICE}/{method}", finished, status >= 500)
                batcher_tracing.current.reset(traced)
            record_request(
                self.services.metrics, model, endpoint_label(route), status, started, trace_id
            )

    async def _ready(self) -> bool:
        return (await server_readiness(self.services)).ready

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
            services, name = self.services, request.name
            registry = services.registry
            if name in services.repository.entries and name not in registry.graphs.keys() | (
                registry.encoders.keys()
            ):  # not loaded (Triton answers not ready, no error), or an LLM
                ready = registry.readiness().get(name, False)
                return service_pb2.ModelReadyResponse(ready=ready and not services.drain.draining)
            model = self._model(name, request.version)
            ok = not services.drain.draining and await model.healthy()
            return service_pb2.ModelReadyResponse(ready=ok)

        return await self._call("ModelReady", context, run, request.name)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        response = service_pb2.ServerMetadataResponse(
            name=self.services.settings.kserve_server_name,
            version=__version__,
            extensions=served_extensions(self.services.settings.allow_client_shm),
        )
        return await self._call("ServerMetadata", context, lambda _: _value(response))

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            model = self._model(request.name, request.version)
            await model.sync_classes()  # another API process's request may have taught some
            metadata = model.metadata()
            # The proto has no place for a ZipMap output's classes (HTTP lists them).
            response = service_pb2.ModelMetadataResponse()
            return json_format.ParseDict(metadata, response, ignore_unknown_fields=True)

        return await self._call("ModelMetadata", context, run, request.name)

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            model = self._model(request.name, request.version)
            await model.sync_classes()
            config = model.config()
            parsed = json_format.ParseDict(config, model_config_pb2.ModelConfig())
            return service_pb2.ModelConfigResponse(config=parsed)

        return await self._call("ModelConfig", context, run, request.name)

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            registry = self.services.registry
            every = [*registry.encoders, *registry.graphs]
            names = [self._model(request.name, request.version).name] if request.name else every
            stats = model_statistics(self.services.metrics.current(), names)
            return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())

        return await self._call("ModelStatistics", context, run, request.name)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._call(
            "ModelInfer", context, partial(self._infer, request, context), request.model_name
        )

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        """Triton's bidirectional stream: each request runs as it arrives, its answer (or its
        error, in `error_message`: the stream goes on) is sent as soon as it is ready, so
        answers may come in another order than their requests (clients match them by `id`).

        Each request's task is created in arrival order and reaches its model's sequence
        admission before its first suspension (server/sequences.py), so the requests of one
        sequence on one stream keep their order."""
        await self._open_stream(context)
        answers: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def answer(request: Any) -> None:
            handler = partial(self._infer, request, context)
            outcome = await self._guarded("ModelStreamInfer", context, handler, request.model_name)
            answers.put_nowait(stream_response(request, outcome))

        async def read() -> None:
            try:
                async for request in requests:
                    task = asyncio.create_task(answer(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:  # the client has sent all: answer the rest, then end the stream
                    await asyncio.wait(set(running))
            finally:
                answers.put_nowait(STREAM_END)

        reader = asyncio.create_task(read())
        try:
            while (response := await answers.get()) is not STREAM_END:
                yield response
            await reader  # a failure reading the stream is the call's
        finally:  # the client went away: its requests' work goes too
            for task in (reader, *running):
                task.cancel()

    async def _open_stream(self, context: grpc.aio.ServicerContext) -> None:
        """A stream without the key, or opened while draining, is refused as a whole, with the
        status a unary call gets (each request is checked again as it comes)."""
        route = GRPC_ROUTES["ModelStreamInfer"]
        try:
            self._policy.tenant(route, lambda: _authorization(context))
            self._policy.admit(route)
        except Exception as exc:
            code, details, _ = grpc_status(failure(exc, route.path))
            await context.abort(code, details)

    def _model(self, name: str, version: str) -> KServeModel:
        return find_model(self.services.registry, self.services.encoder, name, version)

    async def _infer(
        self, request: Any, context: grpc.aio.ServicerContext, tenant: str | None
    ) -> service_pb2.ModelInferResponse:
        """One path for every model: outputs and their classification checked, the inputs
        decoded by the model's signature, then inferred; outputs raw, as Triton sends them."""
        model = self._model(request.model_name, request.model_version)
        asked = request_priority(_parameter(request.parameters, "priority"))
        decided = self.services.priority_policy.apply(asked, tenant)
        if decided.clamped_from is not None:  # said, as the HTTP header says it
            clamped = (CLAMPED_HEADER.decode(), str(decided.clamped_from))
            context.set_trailing_metadata((*context.trailing_metadata(), clamped))
        sequence = sequence_flags(partial(_parameter, request.parameters))
        regions = self.services.shared_memory.of(tenant)
        wanted = model.output_names([o.name for o in request.outputs])
        classified = classifications(request, model)
        tensors = decode_grpc_tensors(request, model.signature, regions)
        placed = output_regions(request, regions)
        # A cancelled call (client gone) cancels this task, and with it the queued work.
        result = await model.infer(tensors, wanted, priority=decided.priority, sequence=sequence)
        outputs = classification.apply(result, classified)
        datatypes = {
            name: "BYTES" if name in classified else model.signature.output(name).datatype
            for name in wanted
        }
        return encode_outputs(request, outputs, datatypes, regions, placed)

    # -- Triton's shared memory extension (kserve/shared_memory.py) ---------------------------

    async def SystemSharedMemoryStatus(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def run(tenant: str | None) -> Any:
            response = service_pb2.SystemSharedMemoryStatusResponse()
            for status in self.services.shared_memory.status(tenant, request.name or None):
                response.regions[status["name"]].CopyFrom(
                    service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**status)
                )
            return response

        return await self._call("SystemSharedMemoryStatus", context, run)

    async def SystemSharedMemoryRegister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def run(tenant: str | None) -> Any:
            body = {"key": request.key, "offset": request.offset, "byte_size": request.byte_size}
            self.services.shared_memory.register(tenant, request.name, body)
            return service_pb2.SystemSharedMemoryRegisterResponse()

        return await self._call("SystemSharedMemoryRegister", context, run)

    async def SystemSharedMemoryUnregister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        async def run(tenant: str | None) -> Any:
            self.services.shared_memory.unregister(tenant, request.name or None)
            return service_pb2.SystemSharedMemoryUnregisterResponse()

        return await self._call("SystemSharedMemoryUnregister", context, run)

    # No CUDA region is ever registered (kserve/shared_memory.py): none listed, unregistering
    # is a no-op, registering or asking for one is refused.
    async def CudaSharedMemoryStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.name:
            return await self._call("CudaSharedMemoryStatus", context, _cuda_unsupported)
        empty = service_pb2.CudaSharedMemoryStatusResponse()
        return await self._call("CudaSharedMemoryStatus", context, lambda _: _value(empty))

    async def CudaSharedMemoryRegister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self._call("CudaSharedMemoryRegister", context, _cuda_unsupported)

    async def CudaSharedMemoryUnregister(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        empty = service_pb2.CudaSharedMemoryUnregisterResponse()
        return await self._call("CudaSharedMemoryUnregister", context, lambda _: _value(empty))

    # -- Triton's model repository extension (server/model_repository.py) ---------------------

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(_: str | None) -> Any:
            _check_repository(request.repository_name)
            entries = await self.services.repository.index(request.ready)
            models = [
                service_pb2.RepositoryIndexResponse.ModelIndex(**e.as_json()) for e in entries
            ]
            return service_pb2.RepositoryIndexResponse(models=models)

        return await self._call("RepositoryIndex", context, run)

    async def RepositoryModelLoad(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(tenant: str | None) -> Any:
            check_tenant_right(self.services.settings, tenant)
            _check_repository(request.repository_name)
            name = request.model_name
            config, files = load_parameters(name, _repository_parameters(request.parameters))
            await self.services.repository.load(name, config, files)
            return service_pb2.RepositoryModelLoadResponse()

        return await self._call("RepositoryModelLoad", context, run)

    async def RepositoryModelUnload(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(tenant: str | None) -> Any:
            check_tenant_right(self.services.settings, tenant)
            _check_repository(request.repository_name)
            name = request.model_name
            dependents = unload_parameters(name, _repository_parameters(request.parameters))
            await self.services.repository.unload(name, dependents)
            return service_pb2.RepositoryModelUnloadResponse()

        return await self._call("RepositoryModelUnload", context, run)


STREAM_END = object()  # the stream's last answer has been queued
FINAL_RESPONSE = "triton_final_response"


def stream_response(request: Any, outcome: Any) -> service_pb2.ModelStreamInferResponse:
    """One stream answer: the response, or the error in `error_message` (Triton's form, which
    tritonclient hands to the callback as an InferenceServerException), with the request's id."""
    if isinstance(outcome, Failure):
        response = service_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=VERSION, id=request.id
        )
        message = service_pb2.ModelStreamInferResponse(
            error_message=kserve_message(outcome), infer_response=response
        )
    else:
        message = service_pb2.ModelStreamInferResponse(infer_response=outcome)
    if _parameter(request.parameters, "triton_enable_empty_final_response") is True:
        # Every answer of a model that is not decoupled is its request's last.
        message.infer_response.parameters[FINAL_RESPONSE].bool_param = True
    return message


async def _cuda_unsupported(_: str | None) -> Any:
    raise NotSupported("cuda_shared_memory", CUDA_UNSUPPORTED)


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


def _parameter(parameters: Any, name: str) -> Any:
    """A request parameter's value (whichever of InferParameter's fields it was sent in);
    ABSENT when not sent, None when sent without a value."""
    if name not in parameters:
        return ABSENT
    choice = parameters[name].WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameters[name], choice)


async def _value(value: Any) -> Any:
    return value


def _code(status: int) -> grpc.StatusCode:
    return (
        grpc.StatusCode.OK if status < 400 else STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)
    )


def _server_span(
    tracer: Tracing, method: str, context: grpc.aio.ServicerContext, request_id: str
) -> ServerSpan:
    """The call's SERVER span, child of the caller's `traceparent` metadata if it sent one; its
    context goes back in the trailing metadata's `traceresponse`."""
    metadata = context.invocation_metadata() or ()
    carrier = {str(k): str(v) for k, v in metadata if k in tracing.TRACE_HEADERS}
    attributes = {
        "rpc.system": "grpc",
        "rpc.service": SERVICE,
        "rpc.method": method,
        tracing.REQUEST_ID: request_id,
    }
    span = tracer.server_span(f"{SERVICE}/{method}", carrier, attributes)
    trailers = (*context.trailing_metadata(), (tracing.TRACERESPONSE, span.traceresponse()))
    context.set_trailing_metadata(trailers)
    return span


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
    services: Services, host: str, port: int, max_message_bytes: int
) -> grpc.aio.Server:
    """Bind and start; the caller stops it (`await server.stop(grace)`) at shutdown."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
        ]
    )
    servicer = InferenceServicer(services)
    answer_unsupported_calls(servicer)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot bind the gRPC port {host}:{port}")
    await server.start()
    logger.info("ferry: KServe v2 gRPC on %s:%d", host, port)
    return server
