"""CPU time of a server process and of its event-loop thread, read from /proc (Linux).

The event loop runs on the process's main thread (tid == pid); the CPU that thread spends per
request is what the loop costs on cores ONNX Runtime also needs. A server of several processes
(LitServe, Mosec) is counted as its whole process tree; it has no one loop thread to single out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int, tid: int | None = None) -> list[str] | None:
    """Fields 3 on of proc(5)'s stat for a process (or one of its threads); None once it is
    gone. The command name (field 2) may hold spaces and parentheses: split after its last ')'."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _cpu_s(fields: list[str] | None) -> float:
    if fields is None:
        raise ProcessLookupError("the process is gone")
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / TICKS_PER_S


def thread_cpu_s(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of one thread (the main thread when `tid` is None)."""
    return _cpu_s(stat_fields(pid, pid if tid is None else tid))


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the whole process, every thread, live or exited."""
    return _cpu_s(stat_fields(pid))


def process_tree(pid: int) -> list[int]:
    """`pid` and every live descendant, parents first (each process's parent read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = stat_fields(int(entry.name))
        if fields is None:  # it exited while we looked
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))  # field 4: the parent
    tree = [pid]
    for parent in tree:  # grows while it is walked: breadth first
        tree.extend(children.get(parent, ()))
    return tree


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its live descendants (one that exited takes its share along)."""
    total = 0.0
    for member in process_tree(pid):
        try:
            total += process_cpu_s(member)
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class CpuSample:
    loop_s: float | None  # None: a process tree, which has no one loop thread
    process_s: float

    @classmethod
    def of(cls, pid: int, tree: bool = False) -> CpuSample:
        if tree:
            return cls(None, tree_cpu_s(pid))
        return cls(thread_cpu_s(pid), process_cpu_s(pid))


@dataclass(frozen=True)
class CpuPerRequest:
    loop_ms: float | None  # the main (event-loop) thread's CPU per completed request
    process_ms: float  # the whole process's (or process tree's) CPU per completed request

    @classmethod
    def between(cls, before: CpuSample, after: CpuSample, requests: int) -> CpuPerRequest:
        n = max(requests, 1)
        loop = None
        if before.loop_s is not None and after.loop_s is not None:
            loop = (after.loop_s - before.loop_s) * 1000 / n
        return cls(loop, (after.process_s - before.process_s) * 1000 / n)
