"""The peer comparison: ratios from one run, thread counts, CPU per request, failures reported."""

from __future__ import annotations

import contextlib

import pytest

from ferry.bench.ceiling import Ceiling
from ferry.bench.peers import (
    FERRY,
    LITSERVE,
    MOSEC,
    TRITON,
    UNBATCHED,
    InputSet,
    PeerResult,
    Plan,
    Threads,
    format_loaded,
    format_serial,
    format_summary,
    run_peer,
)
from ferry.bench.process_cpu import CpuPerRequest
from ferry.bench.sweep import Step

pytestmark = pytest.mark.unit

SETS = (InputSet("short", [[101, 2000, 102]] * 4),)
CEILING = {"short": Ceiling("batch 8 sorted", 800.0, {"batch 8 sorted": 800.0})}


def results() -> list[PeerResult]:
    ferry = PeerResult(FERRY, Threads("2x1 (+solo 1x2)", 2))
    ferry.loaded["short"] = Step(64, 4000, 600.0, 90.0, 200.0, {200: 4000})
    ferry.cpu["short"] = CpuPerRequest(0.25, 3.1)
    ferry.serial = Step(1, 200, 70.0, 10.5, 12.0, {200: 200})
    unbatched = PeerResult(UNBATCHED, Threads("2x1", 1))
    unbatched.loaded["short"] = Step(64, 4000, 300.0, 180.0, 250.0, {200: 4000})
    unbatched.serial = Step(1, 200, 60.0, 12.0, 14.0, {200: 200})
    triton = PeerResult(TRITON, Threads("2x1", 1), skipped="FAILED: boom", failed=True)
    litserve = PeerResult(LITSERVE, Threads("1x2", 2))
    litserve.loaded["short"] = Step(64, 4000, 400.0, 150.0, 160.0, {200: 4000})
    litserve.cpu["short"] = CpuPerRequest(None, 5.5)  # a process tree: no loop figure
    litserve.serial = Step(1, 200, 50.0, 16.0, 18.0, {200: 200})
    mosec = PeerResult(MOSEC, Threads("1x2", 2))
    mosec.loaded["short"] = Step(64, 4000, 480.0, 120.0, 125.0, {200: 4000})
    mosec.serial = Step(1, 200, 55.0, 15.0, 17.0, {200: 200})
    return [ferry, unbatched, triton, litserve, mosec]


def test_ratios_threads_and_cpu_in_the_tables():
    table = format_loaded(SETS[0], results(), CEILING["short"])
    ferry_row, unbatched_row = table.splitlines()[1:3]
    assert "2x1 (+solo 1x2)" in ferry_row and "0.250" in ferry_row and "3.10" in ferry_row
    assert "2.00x" in unbatched_row and "0.80x" in unbatched_row  # req/s and p99 ratios
    assert "FAILED: boom" in table
    litserve_row, mosec_row = table.splitlines()[4:6]
    assert litserve_row.startswith(LITSERVE) and mosec_row.startswith(MOSEC)
    assert "1.50x" in litserve_row and "1.25x" in litserve_row  # 600/400 req/s, 200/160 p99
    assert litserve_row.split()[-2:] == ["-", "5.50"]  # the tree's CPU, no loop thread
    assert "1.25x" in mosec_row and "1.60x" in mosec_row  # 600/480 req/s, 200/125 p99
    assert "0.75x" in table.splitlines()[-1]  # 600 / 800 against the ceiling


def test_one_client_compares_at_the_same_thread_count():
    table = format_serial(results(), {1: 9.0, 2: 10.0})
    ferry_row, unbatched_row = table.splitlines()[1:3]
    assert "10.00 ms, p50 +0.50 ms" in ferry_row
    assert "9.00 ms, p50 +3.00 ms" in unbatched_row
    # One session of every core behind each batcher: compared with batch 1 on as many threads.
    litserve_row = table.splitlines()[4]
    assert litserve_row.startswith(LITSERVE) and "10.00 ms, p50 +6.00 ms" in litserve_row


def test_summary_names_every_ratio_and_the_loop_cpu():
    line = format_summary(SETS, results(), CEILING)
    assert "ceiling 0.75x" in line
    assert f"{UNBATCHED} 2.00x (p99 200 vs 250 ms)" in line
    assert f"{LITSERVE} 1.50x (p99 200 vs 160 ms)" in line
    assert f"{MOSEC} 1.25x (p99 200 vs 125 ms)" in line
    assert "loop CPU 0.250 ms/req" in line


def test_a_peer_that_fails_to_start_is_recorded_as_failed():
    @contextlib.contextmanager
    def broken():
        raise RuntimeError("port in use")
        yield

    plan = Plan(SETS, SETS[0].inputs, 1, 0)
    result = run_peer("broken", Threads("1x1", 1), broken, plan)
    assert result.failed and "port in use" in result.skipped
