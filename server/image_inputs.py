"""An image model's encoded inputs decoded into its graph's tensor, in worker processes.

A request may send the image input as encoded images, one per row (KServe BYTES, base64 strings
in JSON, a raw `image/*` body), or as the graph's own tensor, which passes through. Each image
is decoded in a worker process (server/image_decode.py's pure function; the row comes back
pickled), so base64, Pillow and numpy's normalisation hold neither the event loop's GIL nor,
by default, every core: `preprocess.workers` defaults to one fewer than the cores this process
may run on (at least one), which leaves the loop a core. Images of any size come out the crop's
shape and batch together. Images waiting for a worker are bounded by the model's queue size:
past it, 429 at once; a request of more images than that could never fit, a 413. A worker that
dies (a crash, the OOM killer) fails the requests it held with a 500 and the pool is replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from ferry.backends.image_spec import ImagePlan, declared, manifest_preprocess, plan
from ferry.backends.tensor_signature import Signature
from ferry.backends.thread_priority import lower_this_thread
from ferry.batcher.errors import InferenceFailed, QueueFull
from ferry.server import tracing
from ferry.server.errors import InvalidInput, TooManyItems
from ferry.server.image_decode import decode_image
from ferry.server.settings import ModelSettings
from ferry.server.worker_cores import default_workers, worker_context

logger = logging.getLogger(__name__)
RETRY_AFTER_S = 1.0


class ImageInputs:
    def __init__(self, plan: ImagePlan, model: str, max_pending: int, niceness: int = 0) -> None:
        self.plan = plan
        self.workers = plan.workers or default_workers()
        self._model = model
        self._niceness = niceness
        self._pool = self._new_pool()
        self._max_pending = max_pending
        self._pending = 0
        logger.info(
            "%s: decoding JPEG and PNG for input %r (shorter side %d, crop %dx%d, %s %s) "
            "in %d worker processes",
            model,
            plan.input,
            plan.resize,
            plan.height,
            plan.width,
            plan.layout,
            plan.datatype,
            self.workers,
        )

    def _new_pool(self) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(
            self.workers,
            mp_context=worker_context("ferry.server.image_decode"),
            initializer=lower_this_thread,  # the event loop first (backends/thread_priority.py)
            initargs=(self._niceness,),
        )
        pool.submit(int)  # the workers start now, not on the first request
        return pool

    @property
    def pids(self) -> set[int]:
        """The decoding processes now running."""
        return set(self._pool._processes or {})

    @property
    def input(self) -> str:
        return self.plan.input

    async def decoded(self, tensors: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """`tensors` with the image input decoded when it came encoded (an object array)."""
        items = tensors.get(self.input)
        if items is None or items.dtype != object:
            return tensors
        # size, not len: a raw image body is one image, a 0-d array.
        with tracing.span("ferry.image_decode", **{"ferry.items": items.size}):
            return {**tensors, self.input: await self.decode(items)}

    async def decode(self, items: np.ndarray) -> np.ndarray:
        name = self.input
        # [N, 1] too: Triton's clients often send BYTES so.
        if items.ndim > 2 or (items.ndim == 2 and items.shape[1] != 1):
            raise InvalidInput(
                name, f"encoded images come one per row (shape [N]), got {list(items.shape)}"
            )
        flat = items.reshape(-1)
        if not len(flat):
            raise InvalidInput(name, "needs at least one image")
        if len(flat) > self._max_pending:
            raise TooManyItems(
                name,
                f"{len(flat)} images; the model decodes at most {self._max_pending} at once "
                "(its max_queue_size)",
            )
        if self._pending + len(flat) > self._max_pending:
            raise QueueFull(RETRY_AFTER_S, "the model's image decoders are full; retry later")
        self._pending += len(flat)
        pool = self._pool
        try:
            rows = await asyncio.gather(
                *(
                    asyncio.wrap_future(
                        pool.submit(decode_image, item, self.plan, _where(name, items, i))
                    )
                    for i, item in enumerate(flat)
                )
            )
        except BrokenProcessPool:
            self._replace(pool)
            raise InferenceFailed("the image decoder stopped while decoding this request") from None
        finally:
            self._pending -= len(flat)
        # One image (most requests): a view with the batch axis, not a copy of its pixels.
        return rows[0][np.newaxis] if len(rows) == 1 else np.stack(rows)

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """A new pool for one whose worker died; the requests it held have failed."""
        if broken is not self._pool:  # replaced already, by a request it failed before
            return
        logger.warning("%s: an image decoding process died; starting new ones", self._model)
        broken.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _where(name: str, items: np.ndarray, index: int) -> str:
    return name if items.ndim == 0 else f"{name}[{index}]"


def json_images(data: Any) -> np.ndarray | None:
    """A JSON value of base64 strings (one, or a list) as encoded images; None for anything
    else, left to the tensor parser (the graph's own tensor as nested numbers)."""
    if isinstance(data, str):
        return np.array([data], dtype=object)
    if isinstance(data, list) and data and all(isinstance(item, str) for item in data):
        return np.array(data, dtype=object)
    return None


def image_inputs(
    settings: ModelSettings, metadata: Mapping[str, str], graph: Signature
) -> ImageInputs | None:
    """The preprocessing the config, the folder's manifest or the graph's metadata declares,
    checked against the graph; None where none does."""
    try:
        spec = declared(metadata, settings.preprocess, manifest_preprocess(settings.path))
        if spec is None:
            return None
        image_plan = plan(spec, graph)
    except ValueError as exc:
        raise ValueError(f"model {settings.name!r}: {exc}") from None
    niceness = getattr(settings.backend, "worker_niceness", 0)
    return ImageInputs(image_plan, settings.name, settings.batching.max_queue_size, niceness)
