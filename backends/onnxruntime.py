"""ONNX Runtime backend: a pool of sessions, each bound to its own worker thread.

`session.run` releases the GIL, so N sessions of few threads each run N batches truly at once
(measured on 2 cores: two 1-thread sessions beat one 2-thread session). A batch handed over while
every session is busy waits in the worker pool's own queue, and the first thread to finish takes
it: the next batch starts without a round trip through the event loop (`queues_batches`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np

from ferry.backends.options import OnnxRuntimeOptions
from ferry.backends.ort_cuda import run_bound
from ferry.backends.ort_session import session_options
from ferry.backends.placement import (
    CUDA_EP,
    Device,
    check_session_providers,
    onnxruntime_providers,
)
from ferry.backends.token_inputs import TokenFeed
from ferry.batcher.padding import PaddedBatch

logger = logging.getLogger(__name__)

WARMUP_SHAPES = ((1, 8), (4, 32))
# Auto concurrency: a mid-sized batch, timed with 1..N sessions running at once.
PROBE_SHAPE = (8, 64)
PROBE_ROUNDS = 3
# Fewer sessions win ties: they leave cores for the event loop and use less memory.
PROBE_MARGIN = 1.05


class OnnxRuntimeBackend:
    name = "onnxruntime"
    # A batch handed over while every session runs starts on the first to free, in its thread.
    queues_batches = True

    def __init__(
        self,
        model_path: Path,
        sessions: int = 2,  # 0: measure at start how many concurrent batches pay off
        intra_op_threads: int = 1,
        providers: list[str] | None = None,
        spin_threads: bool = False,
        solo_session: bool = True,
        device: Device = "auto",
        allow_cpu_fallback: bool = False,
    ) -> None:
        self.model_path = model_path
        self._device = device
        self._allow_cpu_fallback = allow_cpu_fallback
        self._auto = sessions == 0
        self.max_concurrency = sessions or max(1, min(os.cpu_count() or 1, 4))
        self._intra_op_threads = intra_op_threads
        self._spin_threads = spin_threads
        self._providers = providers
        # Loading, probing and warm-up, then the solo session's runs.
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_concurrency + 1, thread_name_prefix="ort"
        )
        # One worker thread per serving session, each bound to its own (see _bind_session).
        self._runners: ThreadPoolExecutor | None = None
        self._unbound: queue.SimpleQueue[Any] = queue.SimpleQueue()  # ort sessions (untyped)
        self._bound = threading.local()
        # A batch that runs alone gets a session with every core: the latency of a single call at
        # low load, while the few-thread sessions keep the throughput of many batches at once.
        self._want_solo = solo_session and (os.cpu_count() or 1) > intra_op_threads
        self._solo: Any = None  # an ort session (untyped)
        self._solo_busy = False
        self._in_flight = 0
        self._ready = False
        self.output_names: tuple[str, ...] = ()
        self.sequence_outputs: frozenset[str] = frozenset()
        self.providers: list[str] = []
        self._on_cuda = False
        self.feed: TokenFeed | None = None  # read from the graph at start

    @classmethod
    def from_options(cls, model_path: Path, options: OnnxRuntimeOptions) -> OnnxRuntimeBackend:
        return cls(
            model_path,
            sessions=options.sessions,
            intra_op_threads=options.intra_op_threads,
            spin_threads=options.spin_threads,
            solo_session=options.solo_session,
            device=options.device,
            allow_cpu_fallback=options.allow_cpu_fallback,
        )

    async def start(self) -> None:
        import onnxruntime as ort

        if self._providers is None:
            self._providers = onnxruntime_providers(
                self._device,
                ort.get_available_providers(),
                self._allow_cpu_fallback,
                str(self.model_path),
            )
        if self._providers[0] == CUDA_EP:
            # onnxruntime-gpu[cuda,cudnn] ships CUDA and cuDNN as wheels, not on the loader's path.
            ort.preload_dlls()
        loop = asyncio.get_running_loop()
        sessions = await asyncio.gather(
            *(
                loop.run_in_executor(self._executor, self._new_session)
                for _ in range(self.max_concurrency)
            )
        )
        first = sessions[0]
        self.providers = first.get_providers()
        check_session_providers(
            self._providers, self.providers, self._allow_cpu_fallback, str(self.model_path)
        )
        self._on_cuda = self.providers[0] == CUDA_EP
        self.feed = TokenFeed.from_graph(first.get_inputs(), str(self.model_path))
        self.output_names = tuple(o.name for o in first.get_outputs())
        # A symbolic second dimension named like the ids' sequence axis marks a padded output.
        self.sequence_outputs = frozenset(
            o.name
            for o in first.get_outputs()
            if len(o.shape) >= 2 and o.shape[1] == self.feed.sequence_axis
        )
        if self._auto:
            sessions = sessions[: await self._best_concurrency(sessions)]
            self.max_concurrency = len(sessions)
        if self._want_solo and not self._on_cuda:  # on a GPU, the cores do not run the model
            # Its threads may spin (measured: 6.1 ms instead of 8.5 ms for 64 tokens on 2 cores):
            # it runs only while no other batch does.
            self._solo = await loop.run_in_executor(
                self._executor, self._new_session, os.cpu_count() or 1, True
            )
        for session in sessions:
            self._unbound.put(session)
        self._runners = ThreadPoolExecutor(
            max_workers=len(sessions), thread_name_prefix="ort-run", initializer=self._bind_session
        )
        for batch, length in WARMUP_SHAPES:
            feeds = self.feed.ones(batch, length)
            warm = [*sessions, *([self._solo] if self._solo is not None else [])]
            await asyncio.gather(
                *(loop.run_in_executor(self._executor, s.run, None, feeds) for s in warm)
            )
        self._ready = True
        logger.info("onnxruntime: %s ready on %s", self.model_path, self.providers)

    async def _best_concurrency(self, sessions: list[Any]) -> int:
        """How many sessions running at once give the most sequences per second here."""
        loop = asyncio.get_running_loop()
        n, length = PROBE_SHAPE
        assert self.feed is not None
        feeds = self.feed.ones(n, length)

        def rounds(session: Any) -> None:
            for _ in range(PROBE_ROUNDS):
                session.run(None, feeds)

        await asyncio.gather(*(loop.run_in_executor(self._executor, rounds, s) for s in sessions))
        best, best_rate = 1, 0.0
        for count in range(1, len(sessions) + 1):
            started = time.perf_counter()
            await asyncio.gather(
                *(loop.run_in_executor(self._executor, rounds, s) for s in sessions[:count])
            )
            rate = count * n * PROBE_ROUNDS / (time.perf_counter() - started)
            logger.info("onnxruntime: %d concurrent sessions: %.0f seq/s", count, rate)
            if rate > best_rate * PROBE_MARGIN:
                best, best_rate = count, rate
        return best

    def _new_session(self, threads: int | None = None, spin: bool | None = None) -> Any:
        import onnxruntime as ort

        # Spinning threads burn the cores that the other sessions need when several batches run
        # at once; without spinning a session may use more threads at low load for free.
        spinning = self._spin_threads if spin is None else spin
        options = session_options(threads or self._intra_op_threads, spinning)
        return ort.InferenceSession(str(self.model_path), options, providers=self._providers)

    @property
    def takes_token_types(self) -> bool:
        return self.feed is not None and self.feed.takes_token_types

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        # Only a batch formed with nothing else queued: under load a solo run's threads would
        # share the cores with the other sessions' batches (measured: ~15 % more CPU/request).
        solo = (
            self._solo is not None
            and batch.runs_alone
            and self._in_flight == 0
            and not self._solo_busy
        )
        assert self.feed is not None, "infer before start"
        feeds = self.feed.feeds(batch)
        names = list(batch.outputs or self.output_names)
        loop = asyncio.get_running_loop()
        self._in_flight += 1
        try:
            if solo:
                self._solo_busy = True
                run = functools.partial(self._run, self._solo, names, feeds)
                return await loop.run_in_executor(self._executor, run)
            assert self._runners is not None, "infer before start"
            run = functools.partial(self._run_on_own_session, names, feeds)
            return await loop.run_in_executor(self._runners, run)
        finally:
            self._in_flight -= 1
            if solo:
                self._solo_busy = False

    def _bind_session(self) -> None:
        """A serving worker thread's start: it takes a session of its own for good."""
        self._bound.session = self._unbound.get_nowait()

    def _run_on_own_session(
        self, names: list[str], feeds: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        return self._run(self._bound.session, names, feeds)

    def _run(
        self, session: Any, names: list[str], feeds: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """One run, in a worker thread: the outputs in `names`."""
        if self._on_cuda:  # outputs not asked for stay on the device (unmeasured)
            bound = run_bound(session, feeds, self.output_names, names)
            # run_bound gives None only for the outputs left out of `names`.
            return {
                n: cast(np.ndarray, v)
                for n, v in zip(self.output_names, bound, strict=True)
                if n in names
            }
        return dict(zip(names, session.run(names, feeds), strict=True))

    async def health(self) -> bool:
        return self._ready

    async def close(self) -> None:
        self._ready = False
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._runners is not None:
            self._runners.shutdown(wait=False, cancel_futures=True)
