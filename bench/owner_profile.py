"""Where the LLM owner thread's time goes, from py-spy samples of a running server (issue 45).

`OwnerProfile(pid, path)` records every thread of the server with py-spy (`--idle`, so waits count:
the owner thread's wall time, not only its CPU) while a workload runs; `breakdown` sorts the
owner thread's samples (llm/ortgenai_owner.py, thread `ortgenai-<model>`) into what it was doing:
the forward passes (decode, prefill, speculation's check) and everything that sits between two
decode steps. A forward pass's share includes its GIL hand-back at the end (py-spy reports the
thread on that line while it waits). `bench.llm_peer --py-spy DIR` prints it for each Ferry cell.
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

OWNER_THREAD = "ortgenai-"
IDLE = "waiting for a command (idle)"
# (a frame's text, what the thread was doing): the first rule any frame of a sample matches.
CATEGORIES = (
    ("BatchLane._feed", "prefill forward"),
    ("BatchLane._verify", "speculation's check forward"),
    ("run_with_iobinding", "decode forward"),
    ("Queue.get (queue.py", IDLE),
    ("Future.result", "waiting for a grammar's compile"),
    ("_choose", "sampling"),
    ("TextStream.step", "detokenizing"),
    ("StopMatcher", "stop strings"),
    ("_flush", "handing deltas to the event loop"),
    ("KVModel.decode", "decode inputs and bindings"),
    ("BatchLane._join", "joining the decode block"),
    ("BatchLane._reserve", "growing the decode block"),
    ("BatchLane.remove", "leaving the decode block"),
    ("_admit", "admitting (prompt block, prefix cache)"),
    ("_drain", "reading commands"),
    ("_advance", "building deltas"),
)


def py_spy() -> str:
    """The py-spy next to this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.is_file() else shutil.which("py-spy")
    if found is None:
        raise FileNotFoundError("py-spy is not installed (the `test` extra has it)")
    return found


class OwnerProfile:
    """py-spy recording a process into `path` (collapsed stacks) while the `with` block runs."""

    def __init__(self, pid: int, path: Path, rate: int = 200) -> None:
        self.path = path
        self._command = [py_spy(), "record", "--pid", str(pid), "--threads", "--idle"]
        # Not pausing the server per sample: py-spy's own cost stays off its timing.
        self._command += ["--nonblocking", "--rate", str(rate), "--format", "raw", "-o", str(path)]
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> OwnerProfile:
        self._process = subprocess.Popen(
            self._command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)  # attached before the workload starts
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        self._process.wait(30)


def breakdown(path: Path) -> dict[str, float]:
    """The owner thread's busy samples in `path` by category (CATEGORIES; "other"), as shares;
    its idle ones (the recording starts before the workload, and ends after) as IDLE's share of
    them all."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        frames = stack.split(";")
        if OWNER_THREAD not in frames[0]:  # "thread (id): name", then the frames
            continue
        category = next(
            (name for text, name in CATEGORIES if any(text in frame for frame in frames)),
            "other",
        )
        counts[category] += int(number)
    idle, total = counts.pop(IDLE, 0), sum(counts.values())
    if not total:
        return {}
    shares = {name: count / total for name, count in counts.most_common()}
    return {**shares, IDLE: idle / (idle + total)}


def describe(shares: dict[str, float]) -> str:
    """One line: the busy time's shares, then how much of the recording it was idle."""
    busy = ", ".join(f"{name} {100 * share:.1f}%" for name, share in shares.items() if name != IDLE)
    return f"{busy} (of its busy time; idle {100 * shares.get(IDLE, 0.0):.0f}% of the recording)"
