"""bench.tabular's rounds: every server in every round, who goes first alternating, and Ferry's
CPU counted over its own rounds only."""

from __future__ import annotations

import os
import time

import pytest

from ferry.bench import tabular
from ferry.bench.loadgen import LoadResult

pytestmark = pytest.mark.unit


def test_rounds_alternate_and_ferry_s_cpu_is_its_rounds_alone(monkeypatch):
    sent: list[tuple[str, float]] = []

    def closed_loop(url, payloads, clients, path, seconds, loadgen):
        sent.append((url, seconds))
        if seconds == 0.5:  # every server's measured round: 50 ms of this process's CPU
            end = time.process_time() + 0.05
            while time.process_time() < end:
                pass
        answered = 10 if url == "ferry-url" else 30
        return LoadResult([0.001] * answered, {200: answered}, seconds)

    monkeypatch.setattr(tabular, "closed_loop", closed_loop)
    urls = {"ferry": "ferry-url", "unbatched": "unbatched-url", "triton": "triton-url"}
    cpu = tabular.CpuWindows(os.getpid(), tree=False)
    loads = tabular.measure_rounds(urls, [{}], 4, 0.5, 2, "wrk", cpu)
    warm = [(url, 1.0) for url in urls.values()]
    first = [("ferry-url", 0.5), ("unbatched-url", 0.5), ("triton-url", 0.5)]
    assert sent == warm + first + first[::-1]
    assert {name: len(rounds) for name, rounds in loads.items()} == dict.fromkeys(urls, 2)
    per_request = cpu.per_request()  # Ferry's 2 rounds of 10 requests, 50 ms of CPU each
    assert per_request.process_ms == pytest.approx(5.0, rel=0.3)
    assert per_request.loop_ms == pytest.approx(5.0, rel=0.3)
