"""The sweep's table: one row per level, the curve as bars, the peak marked."""

from __future__ import annotations

import pytest

from ferry.bench.sweep import BAR_WIDTH, Step, cycle, format_table

pytestmark = pytest.mark.unit


def step(concurrency: int, throughput: float, statuses: dict[int, int] | None = None) -> Step:
    statuses = statuses or {200: 10}
    return Step(concurrency, sum(statuses.values()), throughput, 5.0, 9.0, statuses)


def test_the_peak_gets_the_full_bar_and_the_mark():
    lines = format_table([step(1, 50.0), step(2, 100.0)]).splitlines()
    assert lines[-2].count("#") == BAR_WIDTH // 2 and "peak" not in lines[-2]
    assert lines[-1].count("#") == BAR_WIDTH and lines[-1].endswith("<- peak")


def test_the_ceiling_adds_a_percentage_column():
    table = format_table([step(4, 50.0)], ceiling=200.0)
    assert "% ceil" in table and " 25%" in table


def test_errors_count_every_status_but_200():
    assert step(1, 1.0, {200: 7, 429: 2, 503: 1}).errors == 3


def test_cycle_goes_round_the_bodies():
    assert cycle([{"a": 1}, {"b": 2}], 3) == [{"a": 1}, {"b": 2}, {"a": 1}]
