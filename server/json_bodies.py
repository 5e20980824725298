"""Large JSON tensor bodies (KServe v2, and /predict's for plain graphs) parsed in a worker
process, not in the server's.

orjson and numpy hold the GIL through each call, so parsing in a thread of the server still
stalled its event loop for as long as each call took: under bench.images's FP32 tensors (1 MB of
JSON a request) the bodies thread held the GIL 85 % of the time, and `/health/live` answered in
66 ms at p99, 294 ms at worst. A worker parses the body and turns each input's numbers into an
array of its datatype with the server's own conversion (`tensor_inputs.plain_numbers`); the
arrays come back as their bytes. Whatever it cannot convert stays JSON, for the exact path that
names the culprit; a body it cannot parse comes back as None and is read in the server as
before, so every refusal is worded as before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import orjson

from ferry.backends.tensor_signature import DATATYPES
from ferry.server.tensor_inputs import plain_numbers
from ferry.server.worker_cores import default_workers, worker_context

logger = logging.getLogger(__name__)
# The datatypes JSON numbers may be sent as (BF16 goes as binary only), and their arrays' dtypes.
NUMBERS = {d: np.dtype(t) for d, t in DATATYPES.values() if d not in ("BYTES", "BF16")}


def parse(body: bytes) -> dict[str, Any] | None:
    """In the worker: the body as a KServe header whose inputs' `data` are arrays where they
    convert; None where it is not an object with an inputs list (the server says why)."""
    try:
        header = orjson.loads(body)
    except ValueError:
        return None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        return None
    for spec in header["inputs"]:
        if not isinstance(spec, dict):
            continue
        if "data" in spec:
            spec["data"] = _array_if_numbers(spec["data"], spec.get("datatype"))
    return header


def parse_predict(body: bytes, datatypes: Mapping[str, Mapping[str, str]]) -> dict[str, Any] | None:
    """In the worker: a /predict body for a plain graph, its named inputs' numbers made arrays
    of the graph's datatypes (`datatypes`: each graph's, by name; "" for the default model);
    None where it is not an object naming a model by a string (the server says why)."""
    raw = plain_body(body)
    if raw is None:
        return None
    inputs, graph = raw.get("inputs"), datatypes.get(raw.get("model") or "", {})
    if isinstance(inputs, dict):
        for name, data in inputs.items():
            inputs[name] = _array_if_numbers(data, graph.get(name))
    return raw


def plain_body(body: bytes) -> dict[str, Any] | None:
    """A /predict body as JSON if it is an object naming a model by a string (or none); else
    None, left to the encoders' parser and its errors."""
    try:
        raw = orjson.loads(body)
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("model", ""), str):
        return None
    return raw


def _array_if_numbers(data: Any, datatype: Any) -> Any:
    """`data` as an array of `datatype` where it is numbers nested in lists that convert, by the
    server's own rules; else as it came."""
    if isinstance(data, list) and isinstance(datatype, str) and datatype in NUMBERS:
        array = plain_numbers(datatype, NUMBERS[datatype], data)
        if array is not None:
            return array
    return data


async def parsed(body: bytes) -> dict[str, Any] | None:
    """`parse(body)` in a worker process; None where it could not tell (the server parses)."""
    return await _in_worker(parse, body)


async def parsed_predict(
    body: bytes, datatypes: Mapping[str, Mapping[str, str]]
) -> dict[str, Any] | None:
    """`parse_predict(body, datatypes)` in a worker process; None as `parsed`."""
    return await _in_worker(parse_predict, body, datatypes)


async def _in_worker(
    parser: Callable[..., dict[str, Any] | None], *args: Any
) -> dict[str, Any] | None:
    try:
        pool = await _WORKERS.running()
        parsed: dict[str, Any] | None = await asyncio.wrap_future(pool.submit(parser, *args))
        return parsed
    except (BrokenProcessPool, OSError, RuntimeError) as exc:
        # A worker died (the OOM killer) or none could start (a sandbox without fork): the
        # server parses this body, and new workers are tried for the next.
        logger.warning("large JSON bodies are parsed in the server for now: %r", exc)
        _WORKERS.drop()
        return None


class _Workers:
    """The pool, started at the first large body: as many workers as image decoding's (one
    core left to the loop), forked from a server that imported only this module."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    async def running(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # In a thread: starting the fork server and its first worker held the event loop
            # 0.4 s (a 4 MB body's /health/live check failed on it).
            await asyncio.to_thread(self._start)
        assert self._pool is not None
        return self._pool

    def _start(self) -> None:
        with self._lock:  # once, whichever body came first
            if self._pool is not None:
                return
            pool = ProcessPoolExecutor(default_workers(), mp_context=worker_context(__name__))
            try:
                pool.submit(int).result()
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            self._pool = pool

    def drop(self, wait: bool = False) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)


_WORKERS = _Workers()


async def shutdown() -> None:
    """Stop the workers, if any started, and wait for them to end (the app's shutdown): a
    spawned API process or replica joins its children as it exits, and its queues stop first,
    so workers not told to end by then waited for work forever, and so did the process."""
    await asyncio.to_thread(_WORKERS.drop, True)
