"""A GPU-shaped backend for the CPU box: the GIL and the wall-clock time of an accelerator's batch.

What a Python front end feels from a GPU model is not its FLOPs but three things, and each is
simulated here:
- **kernel launches hold the GIL**: each batch spins in a busy Python loop for `launch_ms` of
  its thread's CPU in the backend's own thread (a loop, not a sleep, so the event loop queues
  behind it exactly as it queues behind torch's launches; the thread's CPU, not the wall's
  time, so that the turns the loop takes meanwhile do not count as launching);
- **the device runs with the GIL released**: then the thread sleeps `fixed_ms` plus
  `per_token_us` per padded token (rows x padded length), as `.cpu()` waits on a CUDA stream;
- **streams**: `streams` threads, so that many batches are in flight at once, as the torch
  backend runs CUDA_CONCURRENCY = 2.
Answers are zero embeddings of all-MiniLM's width (as bench/null_backend.py): correctly shaped,
computed by nobody. A plain graph (images, KServe v2 tensors) runs on a device of its own with
the same launch and streams, `fixed_ms` plus `per_row_us` a row (50 us: a ResNet-18-sized CNN
at fp16 on an H100-class GPU, about 20,000 images a second at large batches; an estimate, as
docs/gpu.md measured no CNN), answering zeros of its outputs' shapes.

Calibration, from the H100 figures in docs/benchmarks.md (2026-11-26: the torch backend, MiniLM's
shape in float16, the embedding alone, ms per batch over 20 gathered calls; one or two in flight
made no difference there): 1 x 16 tokens took 2.8-4.3 ms a batch, 128 x 128 took 3.8-4.5 ms.
Issue 43 reads them as "1-2 ms of GIL for kernel launches, then 1 ms + 0.2 us per padded token
with the GIL released, 2 in flight"; the defaults are those, with the launch at the middle of
its range (1.5 ms). Checked against the two points:
- 1 x 16: 1.5 + 1.0 + 0.003 = 2.5 ms, just under the measured floor (which also paid the
  backend's own Python: tensors in, one output out);
- 128 x 128 (16,384 padded tokens): 1.5 + 1.0 + 3.3 = 5.8 ms alone; with two in flight the
  launches serialise on the GIL and the waits overlap, ~2.9 ms a batch, against 3.8-4.5 measured.
The measured slope between the two points is flatter (~0.04 us a token): the issue's 0.2 us is
kept so that runs compare with its first simulated figures (0.51-0.57x at 64 clients). Change
any term through the environment below to try another device.

Selected like the null backend, by entry point; its times come from the environment, read once
when a model's backend is built (so the engine process of `api_servers = N` reads the same):

    FERRY_SIMULATED_DEVICE='{"launch_ms": 1.5, "fixed_ms": 1, "per_token_us": 0.2, "streams": 2,
                             "stats_file": "/tmp/device.json"}' \\
    python -m ferry.bench.simulated_device serve --config ferry.toml

`stats_file` (optional) receives the device's own counters as JSON (batches, rows, padded
tokens, the most batches it ever had in flight) whenever that maximum grows and at close:
tests read it to see the streams used.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from ferry.backends.options import OnnxRuntimeOptions
from ferry.batcher.padding import PaddedBatch
from ferry.bench.null_backend import OUTPUT, WIDTH, ZeroTensorBackend
from ferry.server.settings import ModelSettings

ENV = "FERRY_SIMULATED_DEVICE"


@dataclass(frozen=True)
class DeviceTimes:
    launch_ms: float = 1.5  # GIL held per batch (kernel launches)
    fixed_ms: float = 1.0  # device time per batch, GIL released
    per_token_us: float = 0.2  # device time per padded token, GIL released
    per_row_us: float = 50.0  # a plain graph's batches (images): device time per row
    streams: int = 2  # batches in flight at once
    # The launch on the event loop's own thread and the device's time a timer, with no stream
    # thread: what a CUDA graph replayed from the loop with an event polled there would be.
    # Each batch handed to a thread costs the loop GIL handoffs (docs/benchmarks.md, seventh
    # session); this measures what a backend without them could reach.
    launch_on_loop: bool = False
    stats_file: str | None = None

    def device_s(self, padded_tokens: int) -> float:
        return (self.fixed_ms * 1e3 + self.per_token_us * padded_tokens) / 1e6

    def tensor_device_s(self, rows: int) -> float:
        """A plain graph's batch of `rows` (an image a row): device time, GIL released."""
        return (self.fixed_ms * 1e3 + self.per_row_us * rows) / 1e6

    def batch_s(self, padded_tokens: int) -> float:
        """One batch alone, launch and device."""
        return self.launch_ms / 1e3 + self.device_s(padded_tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> DeviceTimes:
        raw = environ.get(ENV)
        if not raw:
            return cls()
        try:
            return cls(**json.loads(raw))
        except (TypeError, ValueError) as exc:  # a typo must not silently give the defaults
            names = [f.name for f in fields(cls)]
            raise ValueError(f"{ENV}: expected a JSON object of {names}: {exc}") from exc

    def to_env(self) -> dict[str, str]:
        values = {k: v for k, v in asdict(self).items() if v is not None}
        return {ENV: json.dumps(values)}


@dataclass
class DeviceStats:
    batches: int = 0
    rows: int = 0
    padded_tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    launch_s: float = 0.0  # total GIL time spent launching
    # The process's sys.getswitchinterval(): how long a stream thread may wait for the GIL.
    switch_interval_s: float = 0.0

    @classmethod
    def read(cls, path: Path) -> DeviceStats:
        return cls(**json.loads(path.read_text()))


def hold_gil(seconds: float) -> None:
    """Busy Python bytecode for `seconds` of this thread's CPU: the thread keeps the GIL, as
    launching kernels from Python does (a sleep would release it and hide exactly the cost this
    backend exists to show). Python still hands the GIL to a waiting thread every switch
    interval: a launch longer than that is shared with the event loop, as real launch code in
    Python is, and it lasts until it has run its whole time. Timed by the clock on the wall, a
    launch shared so went on while the loop ran, and a 1.5 ms launch under load held the GIL
    for 0.93 ms of it (docs/benchmarks.md, fourteenth session)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class SimulatedDevice:
    """The timing of one accelerator: `streams` threads, each launches then waits per batch."""

    def __init__(self, times: DeviceTimes) -> None:
        self.times = times
        self.stats = DeviceStats()
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # two streams may both see a new maximum
        self._executor = ThreadPoolExecutor(times.streams, thread_name_prefix="sim-stream")
        self._streams = asyncio.Semaphore(times.streams)  # launch_on_loop's streams

    async def run(self, rows: int, padded_tokens: int, device_s: float | None = None) -> None:
        """One batch: launched, then `device_s` on the device (by default its padded tokens')."""
        if device_s is None:
            device_s = self.times.device_s(padded_tokens)
        if not self.times.launch_on_loop:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._batch, rows, padded_tokens, device_s)
            return
        async with self._streams:
            launch_s = self._launched()
            await asyncio.sleep(device_s)
            self._landed(rows, padded_tokens, launch_s)

    def _batch(self, rows: int, padded_tokens: int, device_s: float) -> None:
        launch_s = self._launched()
        time.sleep(device_s)
        self._landed(rows, padded_tokens, launch_s)

    def _launched(self) -> float:
        """A batch in flight and launched; the GIL time its launch took."""
        with self._lock:
            self.stats.in_flight += 1
            grew = self.stats.in_flight > self.stats.max_in_flight
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
        if grew:  # a handful of times per run: cheap enough to keep the file current
            self.write_stats()
        began = time.thread_time()
        hold_gil(self.times.launch_ms / 1e3)
        return time.thread_time() - began

    def _landed(self, rows: int, padded_tokens: int, launch_s: float) -> None:
        with self._lock:
            self.stats.in_flight -= 1
            self.stats.batches += 1
            self.stats.rows += rows
            self.stats.padded_tokens += padded_tokens
            self.stats.launch_s += launch_s

    def write_stats(self) -> None:
        if self.times.stats_file is None:
            return
        path = Path(self.times.stats_file)
        # Written whole, then renamed: a reader never sees half a file.
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with self._writing:
            with self._lock:  # the counters as of now, the last writer the newest
                self.stats.switch_interval_s = sys.getswitchinterval()
                text = json.dumps(asdict(self.stats))
            partial.write_text(text)
            partial.replace(path)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.write_stats()


class SimulatedEncoderBackend:
    """The text encoder's backend (the protocol of backends/base.py) on a simulated device."""

    name = "simulated"
    output_names = (OUTPUT,)
    sequence_outputs: frozenset[str] = frozenset()
    # As the torch backend it stands for: a batch handed over waits for a free stream in the
    # batcher, not inside the backend.
    queues_batches = False
    takes_token_types = False

    def __init__(self, times: DeviceTimes) -> None:
        self.device = SimulatedDevice(times)
        self.max_concurrency = times.streams

    async def start(self) -> None:
        return None

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        await self.device.run(batch.size, batch.padded_tokens)
        return {OUTPUT: np.zeros((batch.size, WIDTH), dtype=np.float32)}

    async def health(self) -> bool:
        return True

    async def close(self) -> None:
        self.device.close()


def build_simulated_backend(settings: ModelSettings) -> SimulatedEncoderBackend:
    return SimulatedEncoderBackend(DeviceTimes.from_env())


class SimulatedTensorBackend(ZeroTensorBackend):
    """A plain graph (images) on a simulated device of its own: `fixed_ms` + `per_row_us` a
    batch, after the launch; its answers zeros of its outputs' shapes."""

    def __init__(self, model_path: Path, options: OnnxRuntimeOptions) -> None:
        super().__init__(model_path, options, self._on_device)
        self.device = SimulatedDevice(DeviceTimes.from_env())
        self.max_concurrency = self.device.times.streams  # batches in flight: its streams

    async def _on_device(self, feeds: dict[str, np.ndarray]) -> None:
        rows = next(iter(feeds.values())).shape[0]
        await self.device.run(rows, 0, self.device.times.tensor_device_s(rows))

    async def close(self) -> None:
        await super().close()
        self.device.close()


def install() -> None:
    """Every text encoder and plain graph this process builds runs on the simulated device
    (the seams bench/null_backend.py uses)."""
    from ferry.server import graph_runtime, model_runtime

    model_runtime.build_backend = build_simulated_backend
    graph_runtime.OnnxTensorBackend = SimulatedTensorBackend  # type: ignore[misc]  # the seam


def main(argv: list[str] | None = None) -> int:
    from ferry import cli

    DeviceTimes.from_env()  # a malformed setting fails here, before the server starts
    install()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__mp_main__":
    # The engine process that `api_servers > 1` spawns from this entry point imports it under
    # this name: its models run on the simulated device too.
    install()
