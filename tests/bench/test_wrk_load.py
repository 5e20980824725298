"""bench/wrk_load.py's pure parts: the Lua script it gives wrk, and its totals read as a
bench/loadgen result (wrk itself is a benchmark tool, not installed for the suite)."""

from __future__ import annotations

import json

import pytest

from ferry.bench.loadgen import merge
from ferry.bench.wrk_load import MARK, PERCENTILES, WrkResult, script

pytestmark = pytest.mark.unit


def test_the_script_sends_every_body_verbatim_and_reports_every_percent():
    bodies = [{"input_ids": [1, 2]}, {"text": ']] "quoted" ]=] ]==]'}]
    lua = script(bodies)
    for body in bodies:  # a level past the brackets a body holds
        assert f"[===[{json.dumps(body)}]===]" in lua
    assert f'io.write("{MARK} "' in lua
    assert "ipairs({0.5, 1.5," in lua and "99.5})" in lua


def test_a_run_reads_as_its_requests_distribution_and_merges_with_others():
    fast = WrkResult(1000, 10, 2.0, {q: q / 10 for q in PERCENTILES})  # 0.05-9.95 ms
    slow = WrkResult(990, 0, 2.0, {q: 100 + q for q in PERCENTILES})  # 100.5-199.5 ms
    assert fast.statuses == {200: 990, 0: 10} and fast.throughput == 495.0
    assert fast.percentile_ms(50) == pytest.approx(5.0, abs=0.1)
    both = merge([fast.as_load_result(), slow.as_load_result()], elapsed=sum)
    assert both.completed == 1980 and both.throughput == 1980 / 4.0
    assert both.percentile_ms(25) < 10 < 100 < both.percentile_ms(75)
