"""Whether this process traces, and the few calls the request path makes either way.

Tracing is off unless `otlp_traces_endpoint` is set: then (and only then) the OpenTelemetry SDK
is imported (server/otel_tracing.py). Off, a request costs nothing here: the span helpers read
one context variable (the traced request, batcher/tracing.py's `current`) and find None.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, cast

from ferry.batcher import tracing as batcher_tracing
from ferry.server.settings import Settings

if TYPE_CHECKING:
    from ferry.llm.base import SamplingSettings
    from ferry.server.openai.observer import GenerationObserver
    from ferry.server.otel_tracing import GenerationSpan, RequestTrace, Tracing

# The W3C Trace Context headers (and gRPC metadata keys) read from a caller.
TRACE_HEADERS = ("traceparent", "tracestate")
TRACE_HEADER_BYTES = tuple(name.encode() for name in TRACE_HEADERS)
TRACERESPONSE = "traceresponse"
# The request id's attribute (server/request_ids.py), on every server span.
REQUEST_ID = "ferry.request_id"
_UNTRACED: AbstractContextManager[Any] = nullcontext()


def start_tracing(settings: Settings) -> Tracing | None:
    """This process's tracing, or None when off (no endpoint, or `OTEL_SDK_DISABLED=true`)."""
    if not settings.otlp_traces_endpoint:
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    try:
        from ferry.server.otel_tracing import Tracing
    except ImportError as exc:
        raise RuntimeError(
            f"otlp_traces_endpoint is set but OpenTelemetry is not installed ({exc}): "
            "pip install 'ferry[tracing]'"
        ) from exc
    return Tracing(settings.otlp_traces_endpoint)


def traced() -> RequestTrace | None:
    """The sampled request the running task handles, if any."""
    return cast("RequestTrace | None", batcher_tracing.current.get())


def span(name: str, **attributes: str | int | float | bool) -> AbstractContextManager[Any]:
    """A span of the current request's for a `with` block; nothing when it is not traced."""
    request = traced()
    if request is None:
        return _UNTRACED
    return request.child(name, attributes or None)


def generation(
    observer: GenerationObserver, model: str, request_id: str, sampling: SamplingSettings, n: int
) -> GenerationSpan | None:
    """The current request's generation span (GenAI attributes), wrapping the metrics
    `observer`; None when the request is not traced."""
    request = traced()
    if request is None:
        return None
    attributes: dict[str, str | int | float] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "ferry",
        "gen_ai.request.id": request_id,
        "gen_ai.request.model": model,
        "gen_ai.response.model": model,
        "gen_ai.request.max_tokens": sampling.max_tokens,
        "gen_ai.request.temperature": sampling.temperature,
        "gen_ai.request.top_p": sampling.top_p,
        "gen_ai.request.n": n,
    }
    return request.generation(observer, attributes)


def carrier() -> dict[str, str]:
    """The current request's trace context, for the engine process ({} when untraced)."""
    request = traced()
    return {} if request is None else request.carrier()


__all__ = [
    "REQUEST_ID",
    "TRACERESPONSE",
    "TRACE_HEADERS",
    "carrier",
    "span",
    "start_tracing",
    "traced",
]
