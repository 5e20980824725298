"""Worker threads below the event loop in the CPU scheduler's queue (Linux nice, per thread).

On a CPU host, inference and image decoding want every core, and the event-loop thread (which
reads requests, forms batches and answers /health/live) waited in the run queue behind them:
bench.images with JPEGs decoded by Ferry on 2 cores, `/health/live` p50 6.0-6.8 ms and p99
37-41 ms with every thread at one priority, p50 1.8 ms and p99 24 ms with the workers at nice
10 (the rest was other processes on the box). The loop takes little CPU, so running it first
costs the workers next to nothing where Ferry owns the cores (nice weighs threads within their
cgroup, a container's). On a host shared with other processes the workers yield to those too:
bench.variable_length there, 550 and 461 req/s at nice 10 against 771 and 521 at 0. Hence off
by default (`worker_niceness`). Threads a lowered thread starts (ONNX Runtime's intra-op pool,
when its session is built there) inherit its niceness.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)


def lower_this_thread(niceness: int) -> None:
    """Raise the calling thread's nice value by `niceness` (a ThreadPoolExecutor initializer).
    Linux only, where nice is per thread; elsewhere, or where refused, the thread runs as is."""
    if niceness <= 0 or sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, now + niceness))
    except OSError as exc:  # a sandbox that forbids it: no harm done
        logger.debug("thread priority left as is: %s", exc)
