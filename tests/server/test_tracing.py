"""Tracing in this process: the spans a batch and its members make (the SDK's in-memory exporter
in place of OTLP; tests/server/test_tracing_live.py sends them to a real trace server), sampling,
and the untraced path loading nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from opentelemetry import trace as api
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest

from ferry.batcher import tracing as batcher_tracing
from ferry.llm.base import SamplingSettings
from ferry.server.metrics import FerryMetrics
from ferry.server.openai.observer import NullObserver
from ferry.server.otel_tracing import Tracing
from ferry.server.route_policy import record_request
from ferry.server.tracing import generation as traced_generation
from tests.batcher.manual_clock import ManualClock
from tests.batcher.test_batcher import RecordingBackend, make, seq

pytestmark = pytest.mark.integration


@pytest.fixture
def exported(monkeypatch):
    """A Tracing whose spans stay in memory, and its exporter."""

    def build(sampler: str = "parentbased_always_on", arg: str | None = None):
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
        if arg is not None:
            monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
        exporter = InMemorySpanExporter()
        return Tracing("unused", SimpleSpanProcessor(exporter)), exporter

    return build


def caller(sampled: bool) -> dict[str, str]:
    flags = "01" if sampled else "00"
    return {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-{flags}"}


async def submit_as(server, batcher, ids: tuple[int, ...]):
    """Submit inside the request's span, as the gateway does."""
    token = batcher_tracing.current.set(server.request)
    try:
        return batcher.submit([seq(*ids)])
    finally:
        batcher_tracing.current.reset(token)


def by_name(spans, name: str):
    return [s for s in spans if s.name == name]


async def test_a_batch_is_one_span_linked_to_each_traced_member(exported):
    tracing, exporter = exported()
    clock = ManualClock()
    batcher = make(RecordingBackend(), clock, dispatch_when_idle=False)
    servers = [tracing.server_span("POST", caller(True), {}) for _ in range(3)]
    futures = [
        f
        for s, ids in zip(servers, [(1, 2), (3,), (4, 5, 6)], strict=False)
        for f in await submit_as(s, batcher, ids)
    ]
    futures += batcher.submit([seq(7)])  # an untraced member of the same batch
    await clock.run_until_done(asyncio.gather(*futures))
    await batcher.close(1)
    for server in servers:
        server.finish("POST /predict", {}, failed=False)

    spans = exporter.get_finished_spans()
    (batch,) = by_name(spans, "ferry.batch")
    assert batch.parent is None  # its own trace
    linked = {link.context.span_id for link in batch.links}
    assert linked == {s.span.get_span_context().span_id for s in servers}
    assert batch.attributes["ferry.batch.size"] == 4
    assert batch.attributes["ferry.batch.padded_length"] == 3
    assert batch.attributes["ferry.batch.padding_ratio"] == pytest.approx(1 - 7 / 12)
    (backend,) = by_name(spans, "ferry.backend")
    assert backend.parent.span_id == batch.context.span_id
    queues = by_name(spans, "ferry.queue")
    assert len(queues) == 3  # the untraced member has none
    for queue in queues:
        assert [link.context.span_id for link in queue.links] == [batch.context.span_id]
    assert len(by_name(spans, "ferry.admission")) == 3


async def test_an_unsampled_request_makes_no_span_and_still_says_its_context(exported):
    tracing, exporter = exported("parentbased_traceidratio", "1.0")
    server = tracing.server_span("POST", caller(False), {})
    assert server.request is None  # nothing for the batcher to record
    assert server.traceresponse().endswith("-00")
    assert server.trace_id() is None  # no exemplar points at a trace nobody kept
    server.finish("POST /predict", {}, failed=False)
    assert exporter.get_finished_spans() == ()


def test_a_root_linked_to_a_sampled_span_is_sampled_whatever_the_ratio(exported):
    tracing, _exporter = exported("traceidratio", "0")
    sampled = api.SpanContext(1, 2, True, api.TraceFlags(api.TraceFlags.SAMPLED))
    kept = tracing.tracer.start_span("ferry.batch", links=[api.Link(sampled)])
    dropped = tracing.tracer.start_span("ferry.batch")
    assert kept.is_recording() and not dropped.is_recording()


def test_a_server_without_tracing_never_loads_the_sdk():
    code = (
        "import sys\n"
        "from ferry.server.app import create_app\n"
        "from ferry.server.procs import engine_main\n"
        "from ferry.server.services import app_services\n"
        "from ferry.server.settings import Settings\n"
        "app = create_app(Settings())\n"
        "assert app_services(app).tracing is None\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.sdk')], 'SDK loaded'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_sampled_requests_trace_id_is_its_durations_exemplar():
    metrics = FerryMetrics(CollectorRegistry())
    record_request(metrics, "m", "/predict", 200, time.perf_counter(), "ab" * 16)
    record_request(metrics, "m", "/predict", 200, time.perf_counter())  # untraced: none
    exposed = generate_latest(metrics.registry).decode()
    with_exemplar = [line for line in exposed.splitlines() if "# {" in line]
    assert len(with_exemplar) == 1
    assert f'trace_id="{"ab" * 16}"' in with_exemplar[0]
    assert with_exemplar[0].startswith("ferry_request_duration_seconds_bucket")


def test_an_llm_request_has_the_genai_attributes_vllm_sets(exported):
    tracing, exporter = exported()
    server = tracing.server_span("POST", caller(True), {})
    token = batcher_tracing.current.set(server.request)
    try:
        sampling = SamplingSettings(max_tokens=8, temperature=0.5, top_p=0.9)
        generation = traced_generation(NullObserver(), "chat", "chatcmpl-1", sampling, 2)
    finally:
        batcher_tracing.current.reset(token)
    assert generation is not None
    generation.first_token(0.25)
    generation.finished("stop", 12, 3, 0.5)
    generation.finished("length", 12, 8, 0.75)  # the second choice of the same prompt
    generation.end(None)

    (span,) = by_name(exporter.get_finished_spans(), "ferry.generate")
    assert span.parent.span_id == server.span.get_span_context().span_id
    expected = {
        "gen_ai.request.model": "chat",
        "gen_ai.request.id": "chatcmpl-1",
        "gen_ai.request.max_tokens": 8,
        "gen_ai.request.n": 2,
        "gen_ai.usage.input_tokens": 12,  # one prompt, billed once
        "gen_ai.usage.output_tokens": 11,
        "gen_ai.latency.time_to_first_token": 0.25,
        "gen_ai.latency.e2e": 0.75,
    }
    assert {k: span.attributes[k] for k in expected} == expected
    assert span.attributes["gen_ai.response.finish_reasons"] == ("stop", "length")
