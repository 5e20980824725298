"""OpenTelemetry traces of requests, their waits and the batches that carry them.

Imported only when tracing is on (`otlp_traces_endpoint`; server/tracing.py decides), so a
server without it never loads the SDK. The SDK reads the standard `OTEL_*` variables itself:
the sampler (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the resource
(`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the exporter's headers, timeout, compression
and certificates (`OTEL_EXPORTER_OTLP_*`) and the batch processor's queue (`OTEL_BSP_*`); the
protocol is `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (or `OTEL_EXPORTER_OTLP_PROTOCOL`):
`http/protobuf` (the default, as the specification says) or `grpc`.

A request is one SERVER span, parent of what it waits on: admission, tokenizing or image
decoding, its wait in the queue, the response. A batch carries many requests, so it is a span of
its own trace, **linked** to each member's request span (and each member's queue span links
back to it); the backend call is its child. A batch is sampled when one of its members is
(`LinkedRoots`): with 1 % sampling, the traces kept still show their batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import Any

from opentelemetry import trace as api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from ferry import __version__
from ferry.batcher.tracing import QueueWait
from ferry.server.openai.observer import GenerationObserver

PROPAGATOR = TraceContextTextMapPropagator()
PROTOCOLS = ("http/protobuf", "grpc")
SERVICE_NAME = "ferry"


class LinkedRoots(Sampler):
    """The configured sampler, except that a root span linked to a sampled span is sampled: a
    batch is kept whenever one of the requests it carries is."""

    def __init__(self, inner: Sampler) -> None:
        self._inner = inner

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: api.TraceState | None = None,
    ) -> SamplingResult:
        is_root = not api.get_current_span(parent_context).get_span_context().is_valid
        if is_root and links and any(link.context.trace_flags.sampled for link in links):
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return self._inner.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"LinkedRoots{{{self._inner.get_description()}}}"


def configured_sampler() -> Sampler:
    """The sampler `OTEL_TRACES_SAMPLER` names (parent-based always-on without it), as the SDK
    reads it: a provider built for nothing else, never used."""
    return TracerProvider(shutdown_on_exit=False).sampler


def otlp_exporter(endpoint: str) -> SpanExporter:
    """The OTLP exporter of the configured protocol, sending to `endpoint` as given."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter(endpoint=endpoint)
    raise ValueError(
        f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL={protocol!r}: Ferry exports traces over "
        + " or ".join(PROTOCOLS)
    )


class Tracing:
    """One process's tracer provider: its spans go to the OTLP endpoint in batches, off the
    event loop (the SDK's exporter thread)."""

    def __init__(self, endpoint: str, processor: SpanProcessor | None = None) -> None:
        # OTEL_SERVICE_NAME, when set, names the service; Ferry otherwise.
        named = os.environ.get("OTEL_SERVICE_NAME")
        resource = Resource.create({} if named else {"service.name": SERVICE_NAME})
        self.provider = TracerProvider(
            sampler=LinkedRoots(configured_sampler()), resource=resource, shutdown_on_exit=False
        )
        self.provider.add_span_processor(processor or BatchSpanProcessor(otlp_exporter(endpoint)))
        self.tracer = self.provider.get_tracer("ferry", __version__)

    def server_span(
        self, name: str, carrier: Mapping[str, str], attributes: Attributes
    ) -> ServerSpan:
        """A request's SERVER span, child of the caller's `traceparent` when it sent one."""
        parent = PROPAGATOR.extract(carrier) if carrier else None
        span = self.tracer.start_span(name, parent, SpanKind.SERVER, attributes)
        return ServerSpan(self.tracer, span)

    def remote(self, carrier: Mapping[str, str]) -> RequestTrace | None:
        """The request another process traces (api_servers > 1), from the context it sent; None
        when it sent none or its trace is not sampled."""
        context = PROPAGATOR.extract(carrier)
        if not api.get_current_span(context).get_span_context().trace_flags.sampled:
            return None
        return RequestTrace(self.tracer, context)

    def shutdown(self) -> None:
        """Export what is buffered, then stop (at the process's end)."""
        self.provider.shutdown()


class RequestTrace:
    """A sampled request: the parent of its spans (its SERVER span, or another process's), and
    the batcher's hooks (batcher/tracing.py: RequestTracer)."""

    __slots__ = ("context", "tracer")

    def __init__(self, tracer: api.Tracer, context: Context) -> None:
        self.tracer = tracer
        self.context = context

    @property
    def span_context(self) -> api.SpanContext:
        return api.get_current_span(self.context).get_span_context()

    def child(self, name: str, attributes: Attributes = None) -> AbstractContextManager[api.Span]:
        """A span of the request's, open for a `with` block (an exception marks it failed)."""
        return self.tracer.start_as_current_span(name, self.context, attributes=attributes)

    def admission(self) -> AbstractContextManager[api.Span]:
        return self.child("ferry.admission")

    def queued(self) -> QueueSpan:
        return QueueSpan(self, self.tracer.start_span("ferry.queue", self.context))

    def generation(self, inner: GenerationObserver, attributes: Attributes) -> GenerationSpan:
        return GenerationSpan(self, inner, attributes)

    def carrier(self) -> dict[str, str]:
        """Its context as W3C headers (traceparent, tracestate), for another process."""
        headers: dict[str, str] = {}
        PROPAGATOR.inject(headers, self.context)
        return headers


class ServerSpan:
    """A request's SERVER span, ended by `finish` when its answer is sent."""

    __slots__ = ("request", "span")

    def __init__(self, tracer: api.Tracer, span: api.Span) -> None:
        self.span = span
        self.request = (
            RequestTrace(tracer, api.set_span_in_context(span)) if span.is_recording() else None
        )

    def traceresponse(self) -> str:
        """W3C Trace Context level 2's `traceresponse`: this span's context, sampled or not."""
        context = self.span.get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"

    def trace_id(self) -> str | None:
        """The trace id when sampled (an exemplar's label), else None."""
        context = self.span.get_span_context()
        return f"{context.trace_id:032x}" if context.trace_flags.sampled else None

    def finish(self, name: str, attributes: Mapping[str, Any], failed: bool) -> None:
        if self.request is not None:
            self.span.update_name(name)
            self.span.set_attributes(attributes)
            if failed:
                self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()


class QueueSpan:
    """A request's wait in a batcher's queue (batcher/tracing.py: QueueWait)."""

    __slots__ = ("open", "request", "span")

    def __init__(self, request: RequestTrace, span: api.Span) -> None:
        self.request = request
        self.span = span
        self.open = True

    def batch(self, model: str, members: Sequence[QueueWait]) -> BatchTrace:
        return BatchTrace(self.request.tracer, model, members)

    def left(self) -> None:
        if self.open:
            self.open = False
            self.span.end()


class BatchTrace:
    """One batch's span (batcher/tracing.py: BatchSpan): a root linked to its members'
    requests; each member's queue span links back to it and ends as it starts."""

    __slots__ = ("_members", "_model", "_span", "_tracer")

    def __init__(self, tracer: api.Tracer, model: str, members: Sequence[QueueWait]) -> None:
        self._tracer = tracer
        self._model = model
        self._members = [m for m in members if isinstance(m, QueueSpan)]
        self._span: api.Span = api.INVALID_SPAN

    def __enter__(self) -> BatchTrace:
        links = [Link(member.request.span_context) for member in self._members]
        self._span = self._tracer.start_span(
            "ferry.batch",
            Context(),  # a root: it belongs to no one request's trace
            links=links,
            attributes={"ferry.model": self._model, "ferry.batch.traced": len(links)},
        )
        batch_context = self._span.get_span_context()
        for member in self._members:
            member.span.add_link(batch_context)
            member.left()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error is not None:
            self._span.record_exception(error)
            self._span.set_status(Status(StatusCode.ERROR, str(error)))
        self._span.end()

    def formed(self, size: int, padded_length: int, real_tokens: int, padded_tokens: int) -> None:
        self._span.set_attributes(
            {
                "ferry.batch.size": size,
                "ferry.batch.padded_length": padded_length,
                "ferry.batch.real_tokens": real_tokens,
                "ferry.batch.padded_tokens": padded_tokens,
                "ferry.batch.padding_ratio": (
                    1.0 - real_tokens / padded_tokens if padded_tokens else 0.0
                ),
            }
        )

    @contextmanager
    def backend(self) -> Iterator[api.Span]:
        with self._tracer.start_as_current_span(
            "ferry.backend",
            api.set_span_in_context(self._span),
            attributes={"ferry.model": self._model},
        ) as span:
            yield span


__all__ = [
    "PROPAGATOR",
    "BatchTrace",
    "GenerationSpan",
    "LinkedRoots",
    "QueueSpan",
    "RequestTrace",
    "ServerSpan",
    "Tracing",
    "otlp_exporter",
]


class GenerationSpan:
    """An LLM request's generations as one span with the GenAI attributes vLLM sets (model,
    sampling, token usage, time to first token, end-to-end time), passing every hook on to the
    metrics observer it wraps (server/openai/observer.py: GenerationObserver)."""

    def __init__(
        self, request: RequestTrace, inner: GenerationObserver, attributes: Attributes
    ) -> None:
        self._inner = inner
        self._span = request.tracer.start_span(
            "ferry.generate", request.context, SpanKind.INTERNAL, attributes
        )
        self._first_token_s: float | None = None
        self._prompt = self._generated = 0
        self._reasons: list[str] = []
        self._seconds = 0.0

    def first_token(self, seconds: float) -> None:
        self._inner.first_token(seconds)
        if self._first_token_s is None:
            self._first_token_s = seconds

    def token(self, seconds_since_last: float) -> None:
        self._inner.token(seconds_since_last)

    def guided_token(self, seconds_since_last: float) -> None:
        self._inner.guided_token(seconds_since_last)

    def structured(self, kind: str) -> None:
        self._inner.structured(kind)
        self._span.set_attribute("ferry.structured", kind)

    def finished(self, reason: str, prompt: int, generated: int, seconds: float) -> None:
        self._inner.finished(reason, prompt, generated, seconds)
        # Choices of one prompt (n > 1) share it: counted once, as OpenAI bills.
        self._prompt = max(self._prompt, prompt)
        self._generated += generated
        self._reasons.append(reason)
        self._seconds = max(self._seconds, seconds)

    def end(self, error: BaseException | None) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.usage.input_tokens": self._prompt,
            "gen_ai.usage.output_tokens": self._generated,
            "gen_ai.response.finish_reasons": self._reasons,
            "gen_ai.latency.e2e": self._seconds,
        }
        if self._first_token_s is not None:
            attributes["gen_ai.latency.time_to_first_token"] = self._first_token_s
        self._span.set_attributes(attributes)
        if error is not None:
            self._span.record_exception(error)
            self._span.set_status(Status(StatusCode.ERROR, str(error)))
        self._span.end()
