"""The GPU benchmark, in one command: Ferry on a GPU against its peers, ratios from one run.

Peers, each started alone on the same GPU, fed the same bodies by the same load generator:
  ferry onnxruntime-cuda   Ferry's batcher on ONNX Runtime's CUDA EP
  ferry torch              Ferry's batcher on the torch backend (float16, SDPA)
  ferry torch cuda_graphs  the same, each batch a replayed CUDA graph (on CUDA only)
  unbatched                a plain FastAPI /predict running ONNX Runtime (CUDA EP) per request
  ferry null backend       Ferry whose backend answers at once: the HTTP front end's ceiling
and the in-process batched ceiling of each backend (sorted batches straight into the backend,
no HTTP, no queue). Mixed (8-128 tokens) and short (8-16) inputs, 64 and 256 clients.

all-MiniLM-L6-v2's real weights when present, else random weights of its shape (the speed is
the same). Targets: Ferry >= 3x the unbatched server and >= 0.7x the in-process ceiling.
Under 8 minutes on one H100 with 16 cores; `--quick --device cpu` runs it end to end anywhere.

python -m ferry.bench.gpu [--device cuda] [--seconds 8] [--clients 64,256] [--quick]
                         [--api-servers 1,2,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from ferry.bench.gpu_ceiling import backend_ceilings
from ferry.bench.gpu_model import BenchModel, bench_model
from ferry.bench.inputs import token_sequences
from ferry.bench.multiload import load_pool, run_load_processes
from ferry.bench.server_process import DEFAULT_MODEL_DIR, ferry_server
from ferry.bench.sweep import Step
from ferry.bench.targets import predict_body
from ferry.bench.unbatched_server import unbatched_server

FERRY_ORT, FERRY_TORCH = "ferry onnxruntime", "ferry torch"
FERRY_TORCH_GRAPHS = "ferry torch cuda_graphs"  # on CUDA only: replayed graphs, no launches
UNBATCHED, NULL = "unbatched FastAPI + ORT", "ferry null backend"
TARGET_VS_UNBATCHED, TARGET_VS_CEILING = 3.0, 0.7
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Config:
    device: str
    seconds: float
    warmup_s: float
    clients: tuple[int, ...]
    sets: dict[str, list[list[int]]]
    processes: int  # load generator processes
    max_batch_size: int
    max_batch_tokens: int
    # `api_servers` levels: beyond 1, Ferry (ORT) and its null backend again with N API processes.
    api_servers: tuple[int, ...] = (1,)


@dataclass
class Results:
    # (peer, input set, clients) -> step; peer -> why it has no figures
    steps: dict[tuple[str, str, int], Step] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    ceilings: dict[tuple[str, str], float] = field(default_factory=dict)  # (backend, set) -> seq/s


def ferry_model(config: Config, path: Path, backend: dict[str, object]) -> dict:
    return {
        "name": "m",
        "path": str(path),
        "backend": {**backend, "device": config.device},
        "batching": {
            "max_batch_size": config.max_batch_size,
            "max_batch_tokens": config.max_batch_tokens,
            "max_queue_size": 4096,
        },
    }


def peers(
    config: Config, model: BenchModel
) -> list[tuple[str, Callable[[], AbstractContextManager[str]]]]:
    onnx = ferry_model(config, model.onnx_dir, {"kind": "onnxruntime", "sessions": 2})
    torch = ferry_model(config, model.hf_dir, {"kind": "torch"})
    found: list[tuple[str, Callable[[], AbstractContextManager[str]]]] = [
        (FERRY_ORT, lambda: ferry_url([onnx])),
        (FERRY_TORCH, lambda: ferry_url([torch])),
        (UNBATCHED, lambda: unbatched_url(model.onnx_dir / "model.onnx", config.device)),
        (NULL, lambda: ferry_url([onnx], module="ferry.bench.null_backend")),
    ]
    if config.device == "cuda":
        graphs = ferry_model(config, model.hf_dir, {"kind": "torch", "cuda_graphs": True})
        found.insert(2, (FERRY_TORCH_GRAPHS, lambda: ferry_url([graphs])))
    for n in (n for n in config.api_servers if n > 1):
        found.append((api_peer(FERRY_ORT, n), lambda n=n: ferry_url([onnx], api_servers=n)))
        found.append(
            (
                api_peer(NULL, n),
                lambda n=n: ferry_url([onnx], module="ferry.bench.null_backend", api_servers=n),
            )
        )
    return found


def api_peer(name: str, api_servers: int) -> str:
    return f"{name} api_servers={api_servers}"


@contextlib.contextmanager
def unbatched_url(model: Path, device: str) -> Iterator[str]:
    with unbatched_server(model, device=device) as peer:  # type: ignore[arg-type]
        yield peer.url


@contextlib.contextmanager
def ferry_url(models: list[dict], module: str = "ferry", api_servers: int = 1) -> Iterator[str]:
    server = {"api_servers": api_servers}
    with ferry_server(models, server, ready_timeout_s=READY_TIMEOUT_S, module=module) as ferry:
        yield ferry.url


def measure_peer(name: str, start, config: Config, results: Results, pool) -> None:
    progress(f"{name} ...")
    began = time.perf_counter()
    try:
        with start() as url:
            for set_name, inputs in config.sets.items():
                bodies = [predict_body(ids) for ids in inputs]
                for clients in config.clients:
                    if config.warmup_s:
                        run_load_processes(
                            pool, config.processes, url, bodies, clients, config.warmup_s
                        )
                    load = run_load_processes(
                        pool, config.processes, url, bodies, clients, config.seconds
                    )
                    step = Step.from_load(clients, load)
                    results.steps[(name, set_name, clients)] = step
                    progress(f"  {set_name}, {clients} clients: {step.throughput:.0f} req/s")
    # Broad on purpose: one broken peer must not end the comparison of the others.
    except Exception as exc:
        results.failed[name] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        progress(f"{name}: failed: {results.failed[name]}")
        return
    progress(f"{name}: done in {time.perf_counter() - began:.0f}s")


def measure_ceilings(config: Config, model: BenchModel, results: Results) -> None:
    for backend in ("onnxruntime", "torch"):
        progress(f"in-process {backend} ceiling ...")
        try:
            figures = asyncio.run(
                backend_ceilings(backend, model, config.device, config.sets, config.max_batch_size)
            )
        except Exception as exc:  # as for the peers: say why, go on
            results.failed[f"in-process {backend}"] = f"{type(exc).__name__}: {exc}"[:300]
            progress(f"in-process {backend}: failed: {exc!r}")
            continue
        for set_name, seq_per_s in figures.items():
            results.ceilings[(backend, set_name)] = seq_per_s
            progress(f"  {set_name}: {seq_per_s:.0f} seq/s")


def report(config: Config, results: Results) -> str:
    lines = []
    head = (
        f"{'peer':26s} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
        f" {'x unbatched':>11} {'x ceiling':>9} {'of null':>7}"
    )
    for set_name, inputs in config.sets.items():
        lengths = [len(s) for s in inputs]
        for clients in config.clients:
            lines += [
                f"\n== {set_name} ({min(lengths)}-{max(lengths)} tokens), {clients} clients ==",
                head,
            ]
            base = results.steps.get((UNBATCHED, set_name, clients))
            levels = [n for n in config.api_servers if n > 1]
            names = [FERRY_ORT, FERRY_TORCH, UNBATCHED, NULL]
            if config.device == "cuda":
                names.insert(2, FERRY_TORCH_GRAPHS)
            names += [api_peer(peer, n) for n in levels for peer in (FERRY_ORT, NULL)]
            for name in names:
                step = results.steps.get((name, set_name, clients))
                if step is None:
                    lines.append(f"{name:26s} failed: {results.failed.get(name, '?')}")
                    continue
                ceiling = results.ceilings.get((ceiling_of(name), set_name))
                # Against the null backend at the same api_servers level.
                level = name[len(FERRY_ORT) :] if name.startswith(FERRY_ORT) else ""
                null = results.steps.get((NULL + level, set_name, clients))
                lines.append(
                    f"{name:26s} {step.throughput:9.0f} {step.p50_ms:8.1f} {step.p99_ms:8.1f}"
                    f" {step.errors:>6} {ratio(step, base):>11} {ratio(step, ceiling):>9}"
                    f" {ratio(step, null):>7}"
                )
            for backend in ("onnxruntime", "torch"):
                ceiling = results.ceilings.get((backend, set_name))
                if ceiling is not None:
                    lines.append(f"{'in-process ' + backend:26s} {ceiling:9.0f}  (seq/s)")
    lines.append("\n" + "\n".join(verdicts(config, results)))
    return "\n".join(lines)


def verdicts(config: Config, results: Results) -> list[str]:
    """The issue's targets, for Ferry on ONNX Runtime, per input set and client count."""
    out = [f"targets: >= {TARGET_VS_UNBATCHED}x unbatched, >= {TARGET_VS_CEILING}x ceiling"]
    for set_name in config.sets:
        for clients in config.clients:
            ferry = results.steps.get((FERRY_ORT, set_name, clients))
            base = results.steps.get((UNBATCHED, set_name, clients))
            ceiling = results.ceilings.get(("onnxruntime", set_name))
            if ferry is None or base is None or not ceiling:
                out.append(f"  {set_name}/{clients}: no figure")
                continue
            vs_base = ferry.throughput / base.throughput if base.throughput else float("inf")
            vs_ceiling = ferry.throughput / ceiling
            ok = vs_base >= TARGET_VS_UNBATCHED and vs_ceiling >= TARGET_VS_CEILING
            out.append(
                f"  {set_name}/{clients}: {vs_base:.1f}x unbatched, {vs_ceiling:.2f}x ceiling"
                f" -> {'met' if ok else 'MISSED'}"
            )
    return out


def ceiling_of(peer: str) -> str:
    if peer.startswith(FERRY_ORT):  # api_servers levels too
        return "onnxruntime"
    return {FERRY_TORCH: "torch", FERRY_TORCH_GRAPHS: "torch"}.get(peer, "")


def ratio(step: Step, other: Step | float | None) -> str:
    value = other.throughput if isinstance(other, Step) else other
    return f"{step.throughput / value:.2f}x" if value else "-"


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--seconds", type=float, default=8.0, help="Per measured step.")
    parser.add_argument("--warmup", type=float, default=2.0, help="Seconds before each step.")
    parser.add_argument("--clients", default="64,256", help="Comma-separated client counts.")
    parser.add_argument("--requests", type=int, default=4000, help="Distinct bodies per set.")
    parser.add_argument("--processes", type=int, default=min(8, (os.cpu_count() or 2) // 2))
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument(
        "--api-servers",
        default="1",
        help="Comma-separated api_servers levels: each beyond 1 measures Ferry (ORT) and its "
        "null backend again with that many API processes in front of the engine process.",
    )
    parser.add_argument(
        "--random-weights", action="store_true", help="MiniLM's shape, random weights."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="A tiny run to check that the benchmark works: 1 s steps, 4 and 8 clients, "
        "batches of 8, 1 load process.",
    )
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> Config:
    clients = tuple(int(c) for c in args.clients.split(","))
    seconds, warmup, requests, processes = args.seconds, args.warmup, args.requests, args.processes
    batch_size, batch_tokens = args.max_batch_size, args.max_batch_tokens
    if args.quick:  # small batches too: a CPU calibrates and runs them in seconds
        clients, seconds, warmup, requests, processes = (4, 8), 1.0, 0.5, 100, 1
        batch_size, batch_tokens = 8, 1024
    sets = {
        "mixed": token_sequences(requests, 8, 128, seed=0),
        "short": token_sequences(requests, 8, 16, seed=1),
    }
    return Config(
        args.device,
        seconds,
        warmup,
        clients,
        sets,
        max(1, processes),
        batch_size,
        batch_tokens,
        tuple(int(n) for n in args.api_servers.split(",")),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_from(args)
    began = time.perf_counter()
    results = Results()
    with tempfile.TemporaryDirectory() as tmp:
        model = bench_model(Path(tmp), args.model_dir, args.random_weights)
        weights = "real all-MiniLM-L6-v2" if model.real_weights else "random, MiniLM's shape"
        progress(f"model: {weights} ({model.onnx_dir})")
        # In-process first, while no server shares the GPU.
        measure_ceilings(config, model, results)
        pool = load_pool(config.processes) if config.processes > 1 else None
        try:
            for name, start in peers(config, model):
                measure_peer(name, start, config, results, pool)
        finally:
            if pool is not None:
                pool.shutdown()
    print(f"device {config.device}; weights: {weights}; {config.seconds:g} s per step,")
    print(f"{config.processes} load-generator processes, closed loop, 1 text per request")
    print(report(config, results))
    print(f"\ntotal {time.perf_counter() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
