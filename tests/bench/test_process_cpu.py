"""Per-thread and per-process CPU read from /proc agree with Python's own clocks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from ferry.bench.process_cpu import (
    CpuPerRequest,
    CpuSample,
    process_cpu_s,
    process_tree,
    thread_cpu_s,
    tree_cpu_s,
)

pytestmark = pytest.mark.integration

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _burn(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_main_thread_counts_only_its_own_cpu():
    pid = os.getpid()
    loop_before, process_before = thread_cpu_s(pid), process_cpu_s(pid)
    worker = threading.Thread(target=_burn, args=(0.3,))
    worker.start()
    worker.join()  # the main thread sleeps meanwhile
    loop_mid, process_mid = thread_cpu_s(pid), process_cpu_s(pid)
    _burn(0.3)
    loop_after = thread_cpu_s(pid)
    # The worker's 0.3 s reach the process total (an exited thread's CPU stays counted)...
    assert process_mid - process_before >= 0.3 - 2 * TICK_S
    # ...but not the main thread's, which then gets its own 0.3 s.
    assert loop_mid - loop_before < 0.15
    assert loop_after - loop_mid >= 0.3 - 2 * TICK_S


def test_main_thread_matches_thread_time():
    _burn(0.2)
    # /proc counts whole clock ticks; thread_time() is finer.
    assert abs(thread_cpu_s(os.getpid()) - time.thread_time()) <= 3 * TICK_S + 0.05


def test_per_request_divides_by_completed_requests():
    per = CpuPerRequest.between(CpuSample(1.0, 3.0), CpuSample(1.5, 5.0), 250)
    assert per.loop_ms == 2.0
    assert per.process_ms == 8.0
    # A process tree has no one loop thread: no loop figure, the tree's CPU.
    tree = CpuPerRequest.between(CpuSample(None, 3.0), CpuSample(None, 5.0), 250)
    assert tree.loop_ms is None and tree.process_ms == 8.0


def test_a_process_tree_counts_its_live_descendants():
    # A grandchild burns 0.3 s of CPU, then waits on its stdin while the tree is read.
    burn = (
        "import sys, time\n"
        "end = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\n"
        "print(flush=True); sys.stdin.read()"
    )
    shell = f"{sys.executable} -c '{burn}'"  # not the shell's last command: a fork
    before = tree_cpu_s(os.getpid())
    child = subprocess.Popen(
        ["sh", "-c", f"{shell}; true"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        child.stdout.readline()  # burnt
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree and len(tree) >= 3
        assert tree_cpu_s(os.getpid()) - before >= 0.3 - 2 * TICK_S
        assert process_cpu_s(os.getpid()) < tree_cpu_s(os.getpid())
        assert CpuSample.of(os.getpid(), tree=True).loop_s is None
    finally:
        child.stdin.close()
        child.wait(10)
