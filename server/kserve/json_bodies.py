"""Large KServe v2 JSON bodies parsed in a worker process, not in the server's.

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
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import cache
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np
import orjson

from ferry.backends.tensor_signature import DATATYPES
from ferry.server.image_inputs import default_workers
from ferry.server.tensor_inputs import plain_numbers

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
        data, datatype = spec.get("data"), spec.get("datatype")
        if isinstance(data, list) and isinstance(datatype, str) and datatype in NUMBERS:
            array = plain_numbers(datatype, NUMBERS[datatype], data)
            if array is not None:
                spec["data"] = array
    return header


async def parsed(body: bytes) -> dict[str, Any] | None:
    """`parse(body)` in a worker process; None where it could not tell (the server parses)."""
    try:
        return await asyncio.wrap_future(_workers().submit(parse, body))
    except (BrokenProcessPool, OSError, RuntimeError) as exc:
        # A worker died (the OOM killer) or none could start (a sandbox without fork): the
        # server parses this body, and new workers are tried for the next.
        logger.warning("large JSON bodies are parsed in the server for now: %r", exc)
        _workers.cache_clear()
        return None


@cache
def _workers() -> ProcessPoolExecutor:
    """Started at the first large body; as many as image decoding's (one core left to the loop),
    forked from a server that imported only this module."""
    context: BaseContext = multiprocessing.get_context("spawn")
    if "forkserver" in multiprocessing.get_all_start_methods():
        forkserver = multiprocessing.get_context("forkserver")
        forkserver.set_forkserver_preload([__name__])
        context = forkserver
    return ProcessPoolExecutor(default_workers(), mp_context=context)
