"""A Ferry process serving KServe v2 on HTTP and gRPC, and requests built the tritonclient way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from ferry.bench.processes import free_port
from ferry.bench.server_process import FerryProcess, default_model_config, ferry_server

RNG = np.random.default_rng(5)


@contextlib.contextmanager
def kserve_server(**server: object) -> Iterator[tuple[FerryProcess, str]]:
    """The server and its gRPC address (host:port)."""
    port = free_port()
    with ferry_server(
        [default_model_config(batching={"max_queue_delay_s": 0.005})],
        server={"grpc_port": port, **server},
    ) as handle:
        yield handle, f"127.0.0.1:{port}"


def padded_batch(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = [101, *RNG.integers(2000, 29000, size=n - 2), 102]
        mask[row, :n] = 1
    return ids, mask
