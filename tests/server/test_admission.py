"""Admission by predicted wait on the real server: a burst it cannot serve in time is refused at
once (429 with Retry-After) instead of waiting to fail with 504."""

from __future__ import annotations

import asyncio

import pytest

from ferry.bench.inputs import token_sequences
from ferry.bench.loadgen import run_load
from ferry.bench.server_process import default_model_config, ferry_server
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

BURST = 800
TIMEOUT_MS = 5000


def test_a_burst_past_its_deadline_is_refused_at_once_not_timed_out():
    inputs = token_sequences(BURST, 120, 128, seed=5)
    with ferry_server([default_model_config(batching={"max_queue_size": 2048})]) as server:
        # Saturation, measured here and now: the machine is shared and its speed varies.
        warm = [{"input_ids": ids} for ids in inputs[:200]]
        saturation = asyncio.run(run_load(server.url, warm, 64)).throughput
        burst = [{"input_ids": ids, "timeout_ms": TIMEOUT_MS} for ids in inputs]
        result = asyncio.run(run_load(server.url, burst, BURST))
        text = server.metrics()
    served = result.statuses.get(200, 0)
    refused = result.statuses.get(429, 0)
    late = result.statuses.get(504, 0)
    goodput = served / result.elapsed_s
    print(
        f"burst of {BURST} x 120-128 tokens, {TIMEOUT_MS} ms deadline: {result.summary()}; "
        f"goodput {goodput:.0f} req/s = {goodput / saturation:.2f} x saturation {saturation:.0f}"
    )
    # Every answer is a result or an immediate refusal. Without admission every request past
    # what ~5 s of saturation serves is a 504 (here ~90 % of the burst); a prediction on a shared
    # 2-core box, with the load generator on the same cores, can still be wrong for a few.
    assert set(result.statuses) <= {200, 429, 504}, result.statuses
    assert late <= 0.1 * BURST, result.statuses
    assert served > 0 and refused > 0, result.statuses
    assert result.refusals_without_retry_after == 0
    assert metric_value(text, "ferry_rejections_total", reason="predicted_late") > 0
    # The server stayed busy with what it admitted (a loose bound: the box is shared).
    assert goodput >= 0.3 * saturation
