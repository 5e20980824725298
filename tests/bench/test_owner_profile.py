"""bench.owner_profile's reading of py-spy's collapsed stacks: the owner thread's samples only,
each by the first category any of its frames matches, idle ones apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.bench.owner_profile import IDLE, breakdown, describe

pytestmark = pytest.mark.unit

OWNER = "thread (7): ortgenai-smol;Thread.run (threading.py:982);OwnerLoop.serve (o.py:1)"
RUN = "KVModel._run (k.py:3);Session.run_with_iobinding (s.py:4)"
RAW = f"""{OWNER};BatchLane._decode (b.py:2);{RUN} 6
{OWNER};BatchLane._feed (b.py:5);{RUN} 2
{OWNER};BatchLane._decode (b.py:2);BatchLane._choose (b.py:6);argmax (n.py:7) 1
{OWNER};OwnerLoop._advance (o.py:8);TextStream.step (d.py:9) 1
{OWNER};OwnerLoop._drain (o.py:10);Queue.get (queue.py:171);Condition.wait (threading.py:327) 10
thread (1): MainThread;Runner.run (asyncio/runners.py:118) 50
"""


def test_the_owner_threads_busy_time_is_split_by_what_it_was_doing(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    shares = breakdown(raw)
    assert shares == {
        "decode forward": 0.6,
        "prefill forward": 0.2,
        "sampling": 0.1,
        "detokenizing": 0.1,
        IDLE: 0.5,
    }
    assert describe(shares).endswith("(of its busy time; idle 50% of the recording)")


def test_a_recording_without_the_owner_thread_has_no_breakdown(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text("thread (1): MainThread;Runner.run (asyncio/runners.py:118) 50\n")
    assert breakdown(raw) == {}
