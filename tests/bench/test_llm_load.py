"""The LLM benchmark's timing arithmetic: TTFT, inter-token latency, SSE bytes split anywhere."""

from __future__ import annotations

import json

import pytest

from ferry.bench.llm_load import RequestTiming, RunResult, request_timing, sse_token_times

pytestmark = pytest.mark.unit


def test_ttft_is_to_the_first_token_and_itl_spreads_the_rest():
    timing = request_timing(10.0, [(10.5, 1), (10.7, 1), (11.1, 2)])
    assert timing.tokens == 4
    assert timing.ttft_s == pytest.approx(0.5)
    assert timing.itl_s == pytest.approx(0.6 / 3)  # three tokens after the first in 0.6 s


def test_a_single_token_has_no_inter_token_latency():
    assert request_timing(0.0, [(0.2, 1)]).itl_s is None


def event(body: dict) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def chunk(content: str | None) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": content}}]})


def test_sse_events_are_timed_by_the_read_that_completed_them():
    stream = (
        chunk("")
        + chunk("Hel")
        + chunk("lo")
        + event({"choices": [], "usage": {"completion_tokens": 3}})
        + b"data: [DONE]\n\n"
    )
    # Split mid-event: "lo" arrives completed only by the third read.
    cut = stream.index(b'"lo"')
    arrivals = [(1.0, stream[:cut]), (2.0, stream[cut : cut + 3]), (3.0, stream[cut + 3 :])]
    times, usage = sse_token_times(arrivals)
    # The role chunk (empty content) is no token; "lo" held two tokens (usage says 3).
    assert times == [(1.0, 1), (3.0, 2)] and usage == 3


def test_medians_over_requests():
    result = RunResult(
        100.0,
        [RequestTiming(4, 0.1, 0.01), RequestTiming(4, 0.3, None), RequestTiming(4, 0.2, 0.03)],
    )
    assert result.ttft_ms == pytest.approx(200.0)
    assert result.itl_ms == pytest.approx(20.0)
