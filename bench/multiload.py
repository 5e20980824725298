"""The closed-loop load generator (bench.loadgen) run in several processes, results merged.

On a 16-core GPU host one Python process cannot send as fast as a batched GPU server answers;
each process drives its share of the clients on its own core, so the figure is the server's.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from ferry.bench.loadgen import LoadResult, merge, run_load


def _one_process(
    url: str, bodies: list[dict], clients: int, path: str, duration_s: float
) -> LoadResult:
    return asyncio.run(run_load(url, bodies, clients, path, duration_s))


def split_clients(concurrency: int, processes: int) -> list[int]:
    """Clients per process, as even as possible, no process without a client."""
    processes = max(1, min(processes, concurrency))
    base, extra = divmod(concurrency, processes)
    return [base + (1 if i < extra else 0) for i in range(processes)]


def load_pool(processes: int, niceness: int = 0) -> ProcessPoolExecutor:
    """Worker processes for run_load_processes, started once per benchmark; `niceness`: they
    yield the cores to the server (and to a probe), as clients on other hosts would."""
    context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(
        processes, mp_context=context, initializer=os.nice, initargs=(niceness,)
    )


def run_load_processes(
    pool: ProcessPoolExecutor | None,
    processes: int,
    url: str,
    bodies: list[dict],
    concurrency: int,
    duration_s: float,
    path: str = "/predict",
) -> LoadResult:
    """`concurrency` clients over `processes` processes of `pool`, each for `duration_s` seconds.

    Without a pool the load runs in this process; with one, even for one process, in the pool
    (a thread measuring beside it then never waits for the load's share of this GIL).
    """
    shares = split_clients(concurrency, processes)
    if pool is None:
        return _one_process(url, bodies, concurrency, path, duration_s)
    futures = [
        # Each process starts at its own offset, so they do not send the same bodies at once.
        pool.submit(_one_process, url, bodies[i:] + bodies[:i], clients, path, duration_s)
        for i, clients in enumerate(shares)
    ]
    return merge([f.result() for f in futures])
