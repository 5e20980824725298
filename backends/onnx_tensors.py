"""ONNX Runtime for any graph: named tensors in, named outputs out, the signature read from it.

Beside the token encoder's backend (onnxruntime.py), which feeds `input_ids`: this one feeds
whatever the graph declares. A pool of sessions, each run in a worker thread (`session.run`
releases the GIL), except a light graph's small batches on the CPU (below). A sequence of maps
(scikit-learn's ZipMap) comes back as an [N, C] FP32 array, its class keys learned from the
first answer and kept in `class_keys`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np

from ferry.backends import bfloat16
from ferry.backends.options import OnnxRuntimeOptions
from ferry.backends.ort_session import session_options
from ferry.backends.placement import check_session_providers, onnxruntime_providers
from ferry.backends.tensor_signature import Signature, TensorSpec, read_signature
from ferry.backends.thread_priority import lower_this_thread
from ferry.batcher.tensor_padding import TensorBatch

logger = logging.getLogger(__name__)

DEFAULT_SESSIONS = 2
# A light graph's batch (server/light_graphs.py: trees, linear models, elementwise ops) of at
# most this many input bytes runs on the event loop's own thread, on the CPU: its run takes tens
# of microseconds, and handing it to a worker thread and back cost the loop more in GIL
# handoffs (bench.tabular, one process, two rounds each alternating: 3175 and 3426 req/s on
# the loop against 2227 and 2999 through threads; the loop's CPU 0.379 and 0.351 ms a request
# against 0.513 and 0.385).
ON_LOOP_MAX_BYTES = 64 * 1024
# A dynamic axis's size in the warm-up run (one row; a few steps along the others).
WARMUP_ROWS = 1
WARMUP_LENGTH = 4


class OnnxTensorBackend:
    name = "onnxruntime"
    queues_batches = False
    sequence_outputs: frozenset[str] = frozenset()

    def __init__(self, model_path: Path, options: OnnxRuntimeOptions) -> None:
        self.model_path = model_path
        self._options = options
        self._on_loop = False  # small batches run on the event loop (a light graph on the CPU)
        self.max_concurrency = options.sessions or DEFAULT_SESSIONS
        # Sessions are built in these threads too: ONNX Runtime's own inherit their niceness.
        self._executor = ThreadPoolExecutor(
            self.max_concurrency,
            thread_name_prefix="ort-tensor",
            initializer=lower_this_thread,
            initargs=(options.worker_niceness,),
        )
        self._sessions: queue.SimpleQueue[Any] = queue.SimpleQueue()  # ort sessions (untyped)
        self.signature = Signature((), ())
        self.providers: list[str] = []
        self.class_keys: dict[str, list[Any]] = {}
        self._bf16: set[str] = set()  # inputs and outputs of BF16, fed and read as OrtValues
        self.metadata: dict[str, str] = {}  # the graph's metadata_props (ferry.preprocess)
        self._ready = False

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.signature.output_names

    async def start(self) -> None:
        import onnxruntime as ort

        options = self._options
        wanted = onnxruntime_providers(
            options.device,
            ort.get_available_providers(),
            options.allow_cpu_fallback,
            str(self.model_path),
        )
        loop = asyncio.get_running_loop()
        new = functools.partial(self._new_session, wanted)
        sessions = await asyncio.gather(
            *(loop.run_in_executor(self._executor, new) for _ in range(self.max_concurrency))
        )
        self.providers = sessions[0].get_providers()
        check_session_providers(
            wanted, self.providers, options.allow_cpu_fallback, str(self.model_path)
        )
        self.signature = read_signature(sessions[0])
        self._bf16 = {
            s.name
            for s in (*self.signature.inputs, *self.signature.outputs)
            if s.datatype == "BF16"
        }
        self.metadata = dict(sessions[0].get_modelmeta().custom_metadata_map)
        for session in sessions:
            self._sessions.put(session)
        await self._warm_up()
        self._ready = True
        logger.info("onnxruntime: %s ready on %s", self.model_path, self.providers)

    def _new_session(self, providers: list[str]) -> Any:
        import onnxruntime as ort

        options = session_options(self._options.intra_op_threads, self._options.spin_threads)
        return ort.InferenceSession(str(self.model_path), options, providers=providers)

    async def _warm_up(self) -> None:
        """One run on zeros: the first request does not pay for ORT's lazy set-up, and a ZipMap
        output tells its class keys. A graph that refuses zeros still serves (logged)."""
        feeds = {spec.name: _zeros(spec) for spec in self.signature.inputs}
        if any(feed is None for feed in feeds.values()):
            return
        try:
            # The check above ruled out None feeds.
            await self.run(cast(dict[str, np.ndarray], feeds), self.output_names)
        except Exception as exc:  # any failure here only skips the warm-up
            logger.warning("onnxruntime: %s: warm-up on zeros failed: %s", self.model_path, exc)

    def run_small_batches_on_loop(self) -> None:
        """The graph is light (its owner read its nodes): batches of at most ON_LOOP_MAX_BYTES
        run on the event loop's thread from now on, where the graph runs on the CPU."""
        self._on_loop = self.providers == ["CPUExecutionProvider"]

    async def infer(self, batch: TensorBatch) -> dict[str, np.ndarray]:
        return await self.run(batch.inputs, batch.outputs or self.output_names)

    async def run(self, feeds: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, Any]:
        if self._on_loop and sum(a.nbytes for a in feeds.values()) <= ON_LOOP_MAX_BYTES:
            try:
                session = self._sessions.get_nowait()
            except queue.Empty:  # every session in a thread's run: wait there, not on the loop
                pass
            else:
                return self._run_on(session, feeds, list(names))
        loop = asyncio.get_running_loop()
        run = functools.partial(self._run, feeds, list(names))
        return await loop.run_in_executor(self._executor, run)

    def _run(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """One run in a worker thread, on a session nobody else holds meanwhile."""
        return self._run_on(self._sessions.get(), feeds, names)

    def _run_on(
        self, session: Any, feeds: dict[str, np.ndarray], names: list[str]
    ) -> dict[str, np.ndarray]:
        """One run on `session`, taken from the pool, and put back after."""
        try:
            if self._bf16 & {*feeds, *names}:
                values = self._run_bf16(session, feeds, names)
            else:
                values = session.run(names, feeds)
        finally:
            self._sessions.put(session)
        return {
            name: self._class_matrix(name, value) if isinstance(value, list) else value
            for name, value in zip(names, values, strict=True)
        }

    def _run_bf16(self, session: Any, feeds: dict[str, np.ndarray], names: list[str]) -> list[Any]:
        """A run with BF16 tensors, their bits in uint16 arrays: as OrtValues both ways."""
        import onnxruntime as ort

        values = {
            n: bfloat16.ort_value(v) if n in self._bf16 else ort.OrtValue.ortvalue_from_numpy(v)
            for n, v in feeds.items()
        }
        outputs = session.run_with_ort_values(names, values)
        return [
            bfloat16.ort_bits(v) if n in self._bf16 else v.numpy()
            for n, v in zip(names, outputs, strict=True)
        ]

    def _class_matrix(self, name: str, maps: list[dict[Any, float]]) -> np.ndarray:
        """ZipMap's list of {class: probability}, one per row, as rows of an [N, C] array."""
        keys = self.class_keys.setdefault(name, list(maps[0]) if maps else [])
        matrix = np.array([[row[k] for k in keys] for row in maps], dtype=np.float32)
        return matrix.reshape(len(maps), len(keys))

    async def health(self) -> bool:
        return self._ready

    async def close(self) -> None:
        self._ready = False
        self._executor.shutdown(wait=False, cancel_futures=True)


def _zeros(spec: TensorSpec) -> np.ndarray | None:
    if spec.datatype == "BYTES":
        return None
    dims = [
        d if isinstance(d, int) else WARMUP_ROWS if i == 0 else WARMUP_LENGTH
        for i, d in enumerate(spec.shape)
    ]
    return np.zeros(dims, dtype=spec.dtype)
