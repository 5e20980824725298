"""CPU time of a server process and of its event-loop thread, read from /proc (Linux).

The event loop runs on the process's main thread (tid == pid); the CPU that thread spends per
request is what the loop costs on cores ONNX Runtime also needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat_cpu_s(stat: Path) -> float:
    text = stat.read_text()
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / TICKS_PER_S


def thread_cpu_s(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of one thread (the main thread when `tid` is None)."""
    return _stat_cpu_s(Path(f"/proc/{pid}/task/{pid if tid is None else tid}/stat"))


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the whole process, every thread, live or exited."""
    return _stat_cpu_s(Path(f"/proc/{pid}/stat"))


@dataclass(frozen=True)
class CpuSample:
    loop_s: float
    process_s: float

    @classmethod
    def of(cls, pid: int) -> CpuSample:
        return cls(thread_cpu_s(pid), process_cpu_s(pid))


@dataclass(frozen=True)
class CpuPerRequest:
    loop_ms: float  # the main (event-loop) thread's CPU per completed request
    process_ms: float  # the whole process's CPU per completed request

    @classmethod
    def between(cls, before: CpuSample, after: CpuSample, requests: int) -> CpuPerRequest:
        n = max(requests, 1)
        return cls(
            (after.loop_s - before.loop_s) * 1000 / n,
            (after.process_s - before.process_s) * 1000 / n,
        )
