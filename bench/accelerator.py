"""Ferry on a simulated accelerator against its own front end's ceiling, ratios from one run.

Issue 43's question, asked on the CPU box: with a device that launches like a GPU (the GIL held
per batch) and runs like one (the GIL released, two streams), is Ferry's front end the limit?
Three figures per input set and client count:
  ferry simulated device   Ferry with the text encoder on bench/simulated_device.py
  ferry null backend       Ferry whose backend answers at once (bench/null_backend.py): the most
                           its front end serves on this box, whatever the device
  device ceiling           the simulated device alone, in this process: the same inputs sorted by
                           length (the least padding any batcher reaches), in batches of the
                           client count (capped at max_batch_size: no more rows can be waiting),
                           as many in flight as it has streams, back to back, no HTTP
and the ratios: simulated / null (issue 43's target: >= 0.9x) and simulated / device ceiling.
Beside each server: its mean batch size in the measured step (from its own
ferry_batch_size_requests histogram); and the most batches the device had in flight. The null
backend answers at once, so its batches are what arrives between two (fewer rows than the
device's, here), and each costs the loop a batch's own steps: its ceiling is what the front end
serves at the batches it forms.

Image tensors too (`--no-images` leaves them out): one [1, 3, 224, 224] FP32 tensor a request
over KServe v2 JSON, to a plain graph of ResNet's signature (`image_graph`) that the simulated
device runs at `per_row_us` a row and the null backend answers at once, its batches up to 64.

Short (8-16 tokens) and mixed (8-128) text, 64 and 256 clients, one request per text, closed
loop, the load generator on the same cores as the servers: wrk (bench/wrk_load.py), which takes
a small share of a core, or `--loadgen python` (bench/loadgen.py, about a core of its own).
Both servers stay up and each step runs in rounds on one then the other, the order
alternating; the verdict lists each round's ratio, so the noise is in view. About 60 s by
default; on a shared 2-core box the figures move between runs, so read the ratios of one run.

python -m ferry.bench.accelerator [--seconds 4] [--rounds 2] [--warmup 1] [--clients 64,256]
                                  [--api-servers 1] [--launch-ms 1.5 --fixed-ms 1 ...]
                                  [--loadgen wrk]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from prometheus_client.parser import text_string_to_metric_families

from ferry.bench.gpu_ceiling import sorted_batches_throughput
from ferry.bench.inputs import token_sequences
from ferry.bench.interleaved import block_order, pooled
from ferry.bench.loadgen import LoadResult
from ferry.bench.server_process import DEFAULT_MODEL_DIR, FerryProcess, ferry_server
from ferry.bench.simulated_device import (
    DeviceStats,
    DeviceTimes,
    SimulatedDevice,
    SimulatedEncoderBackend,
)
from ferry.bench.sweep import Step
from ferry.bench.targets import predict_body
from ferry.bench.wrk_load import closed_loop

SIMULATED, NULL, CEILING = "ferry simulated device", "ferry null backend", "device ceiling"
MODULES = {SIMULATED: "ferry.bench.simulated_device", NULL: "ferry.bench.null_backend"}
TARGET_VS_NULL = 0.9
BATCH_METRIC = "ferry_batch_size_requests"
# The image set: FP32 tensors of a CNN's input, to a plain graph of ResNet's signature whose
# batches the device prices per row (DeviceTimes.per_row_us), over KServe v2 JSON.
IMAGES, IMAGE_MODEL, IMAGE_SHAPE, CLASSES = "images", "img", (3, 224, 224), 1000
IMAGE_BODIES = 8  # distinct bodies: each ~1 MB of JSON
# An image round lasts at least clients / this many seconds (256 clients: 16 s): the front end
# decodes a few dozen such bodies a second here, and wrk counts only the answers of its round.
IMAGE_CLIENTS_PER_S = 16


@dataclass(frozen=True)
class Config:
    seconds: float
    warmup_s: float
    clients: tuple[int, ...]
    sets: dict[str, list[list[int]]]
    device: DeviceTimes
    max_batch_size: int = 128
    max_batch_tokens: int = 16384
    api_servers: int = 1
    rounds: int = 2  # each step's seconds cut into this many rounds, the order alternating
    loadgen: str = "wrk"  # or "python" (bench/loadgen.py, in this process)
    images: bool = True  # the image set beside the text sets

    @property
    def set_names(self) -> list[str]:
        return [*self.sets, *([IMAGES] if self.images else [])]


@dataclass
class Results:
    steps: dict[tuple[str, str, int], Step] = field(default_factory=dict)  # (server, set, clients)
    # Each server's mean batch in the measured rounds, by (server, set, clients).
    mean_batch: dict[tuple[str, str, int], float] = field(default_factory=dict)
    max_in_flight: int = 0
    round_ratios: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # sim / null
    ceilings: dict[tuple[str, int], float] = field(default_factory=dict)  # seq/s
    failed: dict[str, str] = field(default_factory=dict)


def model_config(config: Config) -> dict:
    return {
        "name": "m",
        "path": str(DEFAULT_MODEL_DIR),  # its tokenizer and manifest; the backend is replaced
        "backend": {"kind": "onnxruntime", "sessions": 2},
        "batching": {
            "max_batch_size": config.max_batch_size,
            "max_batch_tokens": config.max_batch_tokens,
            "max_queue_size": 4096,
        },
    }


def image_graph(path: Path) -> Path:
    """A graph of ResNet's signature ([N, 3, 224, 224] FP32 in, [N, 1000] logits out), each row
    its own (a mean per channel, then a product): the backend never runs it, the server reads
    its signature and batch plan from it."""
    weights = np.zeros((IMAGE_SHAPE[0], CLASSES), np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["pixel_values"], ["means"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["means", "weights"], ["logits"]),
        ],
        "image_signature",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["N", *IMAGE_SHAPE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        [numpy_helper.from_array(weights, "weights")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def image_bodies(count: int = IMAGE_BODIES, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "inputs": [
                {
                    "name": "pixel_values",
                    "shape": [1, *IMAGE_SHAPE],
                    "datatype": "FP32",
                    # Three decimals, as float64: "0.123", not float32's widened digits (3 MB).
                    "data": rng.random(int(np.prod(IMAGE_SHAPE))).round(3).tolist(),
                }
            ]
        }
        for _ in range(count)
    ]


def image_model_config(config: Config, work: Path) -> dict:
    return {
        "name": IMAGE_MODEL,
        "path": str(image_graph(work / "image_signature.onnx")),
        "backend": {"kind": "onnxruntime", "sessions": 2},
        "batching": {"max_batch_size": image_batch_rows(config), "max_queue_size": 4096},
    }


@contextlib.contextmanager
def server(name: str, config: Config, stats_file: Path) -> Iterator[FerryProcess]:
    device = replace(config.device, stats_file=str(stats_file))
    images = [image_model_config(config, stats_file.parent)] if config.images else []
    with ferry_server(
        [model_config(config), *images],
        {"api_servers": config.api_servers},
        env=device.to_env(),
        module=MODULES[name],
    ) as ferry:
        yield ferry


def batch_totals(metrics: str) -> tuple[float, float]:
    """(requests batched, batches) so far, from Ferry's batch-size histogram."""
    totals = {"_sum": 0.0, "_count": 0.0}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            suffix = sample.name.removeprefix(BATCH_METRIC)
            if suffix in totals and sample.name.startswith(BATCH_METRIC):
                totals[suffix] += sample.value
    return totals["_sum"], totals["_count"]


def measure(config: Config, results: Results, work: Path) -> None:
    """Both servers up at once; each step is cut into rounds sent to one then the other, who goes
    first alternating (bench/interleaved.py), and pooled: a shared box's load drifts over a
    minute, and rounds seconds apart on both sides suffer it least."""
    with contextlib.ExitStack() as stack:
        servers: dict[str, FerryProcess] = {}
        for name in (SIMULATED, NULL):
            progress(f"starting {name} ...")
            try:
                servers[name] = stack.enter_context(server(name, config, stats_path(work, name)))
            # Broad on purpose: one server that fails must not end the comparison.
            except Exception as exc:
                results.failed[name] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
                progress(f"{name}: failed: {results.failed[name]}")
        for set_name, inputs in config.sets.items():
            bodies = [predict_body(ids) for ids in inputs]
            for clients in config.clients:
                measure_step(config, results, servers, (set_name, clients), bodies)
        if config.images:
            bodies, path = image_bodies(), f"/v2/models/{IMAGE_MODEL}/infer"
            for clients in config.clients:
                measure_step(config, results, servers, (IMAGES, clients), bodies, path)
    stats_file = stats_path(work, SIMULATED)
    if stats_file.exists():
        results.max_in_flight = DeviceStats.read(stats_file).max_in_flight


def settle(ferry: FerryProcess, timeout_s: float = 120.0) -> str:
    """The server's metrics once it has answered everything sent to it. wrk stops with its
    requests in flight, which the server still computes (256 image tensors are seconds of
    JSON here); they must not run into the next round, nor time out the scrape."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(f"{ferry.url}/metrics", headers=ferry.headers, timeout=timeout_s).text
        if in_flight(text) <= 1 or time.monotonic() > deadline:  # 1: this scrape
            return text
        time.sleep(0.1)


def in_flight(metrics: str) -> float:
    """HTTP requests the server is handling, every endpoint (ferry_in_flight_requests)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "ferry_in_flight_requests"
        for sample in family.samples
    )


def stats_path(work: Path, name: str) -> Path:
    return work / f"{name.replace(' ', '-')}.json"


def measure_step(
    config: Config,
    results: Results,
    servers: dict[str, FerryProcess],
    step: tuple[str, int],
    bodies: list[dict],
    path: str = "/predict",
) -> None:
    """One input set at one client count on every server: warm-up, then the rounds."""
    set_name, clients = step
    round_s = config.seconds / config.rounds
    if set_name == IMAGES:  # answers take seconds: a round must hold many of them
        round_s = max(round_s, clients / IMAGE_CLIENTS_PER_S)
    for ferry in servers.values():
        if config.warmup_s:
            closed_loop(ferry.url, bodies, clients, path, config.warmup_s, config.loadgen)
            settle(ferry)
    rounds: dict[str, list[LoadResult]] = {name: [] for name in servers}
    batched = {name: (0.0, 0.0) for name in servers}  # (requests, batches) in measured rounds
    for index in range(config.rounds):
        for name in block_order(index, list(servers)):
            ferry = servers[name]
            rows, batches = batch_totals(ferry.metrics())
            rounds[name].append(
                closed_loop(ferry.url, bodies, clients, path, round_s, config.loadgen)
            )
            rows_after, batches_after = batch_totals(settle(ferry))
            total_rows, total_batches = batched[name]
            batched[name] = (
                total_rows + rows_after - rows,
                total_batches + batches_after - batches,
            )
    for name, loads in rounds.items():
        done = results.steps[(name, set_name, clients)] = pooled(loads, clients)
        progress(f"  {name}, {set_name}, {clients} clients: {done.throughput:.0f} req/s")
    for name, (rows, batches) in batched.items():
        if batches:
            results.mean_batch[(name, set_name, clients)] = rows / batches
    if SIMULATED in rounds and NULL in rounds:
        results.round_ratios[step] = [
            a.throughput / b.throughput if b.throughput else 0.0
            for a, b in zip(rounds[SIMULATED], rounds[NULL], strict=True)
        ]


async def device_ceilings(config: Config) -> dict[tuple[str, int], float]:
    """The simulated device alone (no server): sorted batches of each client count's size."""
    backend = SimulatedEncoderBackend(replace(config.device, stats_file=None))
    try:
        ceilings = {
            (set_name, clients): await sorted_batches_throughput(
                backend, inputs, min(clients, config.max_batch_size)
            )
            for set_name, inputs in config.sets.items()
            for clients in config.clients
        }
        if config.images:
            for clients in config.clients:
                rows = min(clients, image_batch_rows(config))
                ceilings[(IMAGES, clients)] = await image_ceiling(backend.device, rows)
        return ceilings
    finally:
        await backend.close()


def image_batch_rows(config: Config) -> int:
    return min(config.max_batch_size, 64)


async def image_ceiling(device: SimulatedDevice, rows: int, batches: int = 40) -> float:
    """Images a second: batches of `rows` back to back, as many in flight as the streams."""
    slots = asyncio.Semaphore(device.times.streams)

    async def run() -> None:
        async with slots:
            await device.run(rows, 0, device.times.tensor_device_s(rows))

    started = time.perf_counter()
    await asyncio.gather(*(run() for _ in range(batches)))
    return rows * batches / (time.perf_counter() - started)


def report(config: Config, results: Results) -> str:
    head = (
        f"{'':24s} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6} {'x null':>6}"
        f" {'x device':>8}  batch"
    )
    lines = []
    for set_name in config.set_names:
        if set_name == IMAGES:
            what = f"1 x {' x '.join(map(str, IMAGE_SHAPE))} FP32, KServe v2 JSON"
        else:
            lengths = [len(s) for s in config.sets[set_name]]
            what = f"{min(lengths)}-{max(lengths)} tokens"
        for clients in config.clients:
            lines += [f"\n== {set_name} ({what}), {clients} clients ==", head]
            null = results.steps.get((NULL, set_name, clients))
            ceiling = results.ceilings.get((set_name, clients))
            for name in (SIMULATED, NULL):
                step = results.steps.get((name, set_name, clients))
                if step is None:
                    lines.append(f"{name:24s} failed: {results.failed.get(name, '?')}")
                    continue
                mean = results.mean_batch.get((name, set_name, clients))
                batch = f"  {mean:.1f}" if mean else ""
                lines.append(
                    f"{name:24s} {step.throughput:8.0f} {step.p50_ms:7.1f} {step.p99_ms:7.1f}"
                    f" {step.errors:>6} {ratio(step.throughput, null)}"
                    f" {ratio(step.throughput, ceiling):>8}{batch}"
                )
            if ceiling is not None and set_name == IMAGES:
                rows = min(clients, image_batch_rows(config))
                lines.append(f"{CEILING:24s} {ceiling:8.0f}  images/s, batches of {rows}")
            elif ceiling is not None:
                lines.append(
                    f"{CEILING:24s} {ceiling:8.0f}  seq/s, batches of "
                    f"{min(clients, config.max_batch_size)} sorted"
                )
    lines.append("\n" + "\n".join(verdicts(config, results)))
    return "\n".join(lines)


def verdicts(config: Config, results: Results) -> list[str]:
    out = [f"target: ferry on the simulated device >= {TARGET_VS_NULL}x its null backend"]
    for set_name in config.set_names:
        for clients in config.clients:
            simulated = results.steps.get((SIMULATED, set_name, clients))
            null = results.steps.get((NULL, set_name, clients))
            if simulated is None or null is None or not null.throughput:
                out.append(f"  {set_name}/{clients}: no figure")
                continue
            share = simulated.throughput / null.throughput
            verdict = "met" if share >= TARGET_VS_NULL else "MISSED"
            spread = results.round_ratios.get((set_name, clients), [])
            each = f" (rounds: {', '.join(f'{r:.2f}' for r in spread)})" if spread else ""
            out.append(f"  {set_name}/{clients}: {share:.2f}x null{each} -> {verdict}")
    return out


def ratio(value: float, other: Step | float | None) -> str:
    base = other.throughput if isinstance(other, Step) else other
    return f"{value / base:5.2f}x" if base else "     -"


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = DeviceTimes()
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="Per measured step.")
    parser.add_argument("--rounds", type=int, default=2, help="Alternating rounds per step.")
    parser.add_argument("--warmup", type=float, default=1.0, help="Seconds before each step.")
    parser.add_argument("--clients", default="64,256", help="Comma-separated client counts.")
    parser.add_argument("--requests", type=int, default=2000, help="Distinct bodies per set.")
    parser.add_argument("--api-servers", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--launch-ms", type=float, default=defaults.launch_ms, help="GIL held.")
    parser.add_argument("--fixed-ms", type=float, default=defaults.fixed_ms)
    parser.add_argument("--per-token-us", type=float, default=defaults.per_token_us)
    parser.add_argument("--per-row-us", type=float, default=defaults.per_row_us, help="Images.")
    parser.add_argument("--streams", type=int, default=defaults.streams)
    parser.add_argument(
        "--launch-on-loop",
        action="store_true",
        help="Launch on the event loop's thread, the device's time a timer: no stream threads.",
    )
    parser.add_argument("--loadgen", choices=("wrk", "python"), default="wrk")
    parser.add_argument("--no-images", action="store_true", help="The text sets only.")
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> Config:
    return Config(
        seconds=args.seconds,
        warmup_s=args.warmup,
        clients=tuple(int(c) for c in args.clients.split(",")),
        sets={  # the GPU benchmark's sets (bench/gpu.py), so the figures compare
            "short": token_sequences(args.requests, 8, 16, seed=1),
            "mixed": token_sequences(args.requests, 8, 128, seed=0),
        },
        device=DeviceTimes(
            launch_ms=args.launch_ms,
            fixed_ms=args.fixed_ms,
            per_token_us=args.per_token_us,
            per_row_us=args.per_row_us,
            streams=args.streams,
            launch_on_loop=args.launch_on_loop,
        ),
        max_batch_size=args.max_batch_size,
        api_servers=args.api_servers,
        rounds=max(1, args.rounds),
        loadgen=args.loadgen,
        images=not args.no_images,
    )


def main(argv: list[str] | None = None) -> int:
    config = config_from(parse_args(argv))
    began = time.perf_counter()
    results = Results()
    progress("device ceiling (in process) ...")
    results.ceilings = asyncio.run(device_ceilings(config))
    with tempfile.TemporaryDirectory() as tmp:
        measure(config, results, Path(tmp))
    device = config.device
    print(
        f"simulated device: {device.launch_ms:g} ms of GIL per batch, then {device.fixed_ms:g} ms"
        f" + {device.per_token_us:g} us per padded token (images: {device.per_row_us:g} us a"
        f" row) without it, {device.streams} streams"
        f"{', launched on the event loop' if device.launch_on_loop else ''}"
        f" (most in flight seen: {results.max_in_flight})"
    )
    print(
        f"{config.seconds:g} s per step in {config.rounds} alternating rounds after"
        f" {config.warmup_s:g} s of warm-up, closed loop, load from {config.loadgen},"
        f" api_servers = {config.api_servers}, max_batch_size {config.max_batch_size}"
    )
    print(report(config, results))
    print(f"\ntotal {time.perf_counter() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
