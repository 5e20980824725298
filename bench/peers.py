"""Ferry against its peers, in one run, on the same inputs, ratios printed from that run.

Peers, each started alone (the machine has 2 cores; nothing else of ours runs beside it):
  ferry                    Ferry's micro-batcher on ONNX Runtime (`ferry serve`)
  unbatched                an async FastAPI /predict, one 1-thread ONNX Runtime session per core
                           (bench/unbatched_server.py): the strongest server without batching
  Triton                   Triton's dynamic batcher in front of its python backend, which runs
                           ONNX Runtime (clients on its KServe v2 HTTP endpoint)
  ferry->Triton batch      Ferry batches, one Triton request per batch
  ferry->Triton pass       Ferry passes each request through; Triton's batcher batches
  LitServe, Mosec          each framework's own dynamic batcher (max batch 32, 5 ms wait) in
                           front of one ONNX Runtime session of every core, each batch padded to
                           its longest row (bench/litserve_server.py, bench/mosec_server.py)
For mixed (8-128 tokens) and short (8-16 tokens) inputs at 64 clients, then one client at a
time against in-process batch-1 latency at the same ONNX Runtime thread count as the session
that serves it. The in-process ONNX Runtime figure (best of bench/ceiling.py's strategies) is
the ceiling. CPU per request is read from /proc for the servers we start: the main thread's
(the event loop) and the whole process's; for LitServe and Mosec, servers of several processes,
the whole process tree's. A peer that fails makes the run exit 1, with why, after the others
are measured; only `--no-triton` skips the three Triton peers, `--no-litserve-mosec` those two.

Other work on the machine makes absolute figures noisy: read the ratios, taken in one run.

python -m ferry.bench.peers [--mixed-requests 1500] [--short-requests 4000] [--no-triton]
    [--no-litserve-mosec]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from ferry.bench.batched_peer import batched_peer
from ferry.bench.ceiling import Ceiling, batch1_p50_ms, ceiling
from ferry.bench.inputs import token_sequences
from ferry.bench.process_cpu import CpuPerRequest, CpuSample
from ferry.bench.server_process import DEFAULT_MODEL_DIR, default_model_config, ferry_server
from ferry.bench.sweep import Budget, Step, measure
from ferry.bench.targets import Target
from ferry.bench.triton_peer import INSTANCES, TRITON_MODEL, triton_peer
from ferry.bench.unbatched_server import THREADS_PER_SESSION, unbatched_server

FERRY = "ferry (onnxruntime)"
UNBATCHED = "unbatched FastAPI + ORT"
TRITON = "Triton (python backend + ONNX Runtime)"
TRITON_PEERS = (TRITON, "ferry -> Triton py+ORT (batch)", "ferry -> Triton py+ORT (pass)")
LITSERVE = "LitServe (batching) + ORT"
MOSEC = "Mosec (batching) + ORT"
# Each framework's own batcher, in a server module of its own (bench/batched_peer.py).
BATCHED_PEERS = {LITSERVE: "ferry.bench.litserve_server", MOSEC: "ferry.bench.mosec_server"}
STEP_TIMEOUT_S = 300.0
CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class InputSet:
    name: str
    inputs: list[list[int]]

    @property
    def describe(self) -> str:
        lengths = [len(s) for s in self.inputs]
        return f"{self.name}: {len(lengths)} requests of {min(lengths)}-{max(lengths)} tokens"


@dataclass(frozen=True)
class Threads:
    """ONNX Runtime threads: the layout under load, and what serves one request alone."""

    loaded: str
    serial: int


@dataclass(frozen=True)
class Peer:
    target: Target
    pid: int | None = None  # the server process whose CPU is read; None when not ours
    tree: bool = False  # read the CPU of its whole process tree (no one loop thread)


@dataclass
class PeerResult:
    name: str
    threads: Threads
    loaded: dict[str, Step] = field(default_factory=dict)  # input set name -> step
    cpu: dict[str, CpuPerRequest] = field(default_factory=dict)  # input set name or "serial"
    serial: Step | None = None
    skipped: str = ""  # why the peer has no figures, if it has none
    failed: bool = False  # it should have figures and has none


@dataclass(frozen=True)
class Plan:
    sets: tuple[InputSet, ...]
    serial_inputs: list[list[int]]
    concurrency: int
    warmup: int


async def _measured(
    peer: Peer, bodies: list[dict], concurrency: int
) -> tuple[Step, CpuPerRequest | None]:
    pid = peer.pid
    before = CpuSample.of(pid, peer.tree) if pid else None
    budget = Budget(len(bodies), None, STEP_TIMEOUT_S)
    step = await measure(peer.target, bodies, concurrency, budget)
    if not pid or before is None:
        return step, None
    return step, CpuPerRequest.between(before, CpuSample.of(pid, peer.tree), step.completed)


async def measure_peer(result: PeerResult, peer: Peer, plan: Plan) -> PeerResult:
    for input_set in plan.sets:
        bodies = peer.target.bodies(input_set.inputs)
        if plan.warmup:
            warm = Budget(plan.warmup, None, STEP_TIMEOUT_S)
            await measure(peer.target, bodies, plan.concurrency, warm)
        step, cpu = await _measured(peer, bodies, plan.concurrency)
        result.loaded[input_set.name] = step
        if cpu:
            result.cpu[input_set.name] = cpu
        _progress(f"  {result.name}, {input_set.name}: {step.throughput:.1f} req/s")
    result.serial, cpu = await _measured(peer, peer.target.bodies(plan.serial_inputs), 1)
    if cpu:
        result.cpu["serial"] = cpu
    return result


def run_peer(
    name: str, threads: Threads, start: Callable[[], AbstractContextManager[Peer]], plan: Plan
) -> PeerResult:
    """Start the peer, measure it, stop it; a failure is recorded and the others still run."""
    _progress(f"{name} ...")
    began = time.perf_counter()
    try:
        with start() as peer:
            result = asyncio.run(measure_peer(PeerResult(name, threads), peer, plan))
    # Broad on purpose: one broken peer must not end the comparison of the others.
    except Exception as exc:
        _progress(f"{name}: failed: {exc!r}")
        return PeerResult(name, threads, skipped=f"FAILED: {_one_line(exc)}", failed=True)
    _progress(f"{name}: done in {time.perf_counter() - began:.0f}s")
    return result


def ferry_threads() -> Threads:
    config = default_model_config()
    # One request alone runs on the solo session of every core (backends/onnxruntime.py).
    return Threads(f"{config['backend']['sessions']}x1 (+solo 1x{CORES})", CORES)


@contextlib.contextmanager
def ferry_peer(model: dict) -> Iterator[Peer]:
    with ferry_server([model]) as server:
        yield Peer(Target(server.url, "predict"), server.pid)


@contextlib.contextmanager
def unbatched_peer(model_dir: Path) -> Iterator[Peer]:
    with unbatched_server(model_dir / "model.onnx", CORES) as server:
        yield Peer(Target(server.url, "predict"), server.pid)


@contextlib.contextmanager
def framework_peer(module: str, model_dir: Path) -> Iterator[Peer]:
    with batched_peer(module, model_dir / "model.onnx") as server:
        yield Peer(Target(server.url, "predict"), server.pid, tree=True)


@contextlib.contextmanager
def given(target: Target) -> Iterator[Peer]:
    yield Peer(target)


def run_triton_peers(model_dir: Path, plan: Plan, protocol: str) -> list[PeerResult]:
    threads = Threads(f"{INSTANCES}x1", 1)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        try:
            triton = stack.enter_context(triton_peer(model_dir, Path(tmp)))
        # Broad on purpose: whatever keeps Triton from starting, say why; main() exits 1.
        except Exception as exc:
            why = f"FAILED: Triton did not start: {_one_line(exc)}"
            _progress(why)
            return [PeerResult(name, threads, skipped=why, failed=True) for name in TRITON_PEERS]
        direct = Target(f"http://{triton.http_url}", "kserve", TRITON_MODEL)
        results = [run_peer(TRITON_PEERS[0], threads, lambda: given(direct), plan)]
        for name, mode in zip(TRITON_PEERS[1:], ("batch", "passthrough"), strict=True):
            backend = {"kind": "triton", "url": triton.url_for(protocol), "protocol": protocol}
            model = default_model_config(backend={**backend, "model": TRITON_MODEL, "mode": mode})
            results.append(run_peer(name, threads, lambda m=model: ferry_peer(m), plan))
    return results


def format_loaded(input_set: InputSet, results: list[PeerResult], best: Ceiling) -> str:
    ferry = _ferry(results).loaded.get(input_set.name)
    lines = [
        f"{'peer':38s} {'threads':>17} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}"
        f" {'ferry/peer req/s':>16} {'ferry/peer p99':>14} {'loop ms/req':>11} {'proc ms/req':>11}"
    ]
    for result in results:
        step = result.loaded.get(input_set.name)
        if step is None:
            lines.append(f"{result.name:38s} {result.skipped}")
            continue
        req_ratio = _ratio(ferry.throughput if ferry else None, step.throughput)
        p99_ratio = _ratio(ferry.p99_ms if ferry else None, step.p99_ms)
        loop, proc = _cpu(result.cpu.get(input_set.name))
        lines.append(
            f"{result.name:38s} {result.threads.loaded:>17} {step.throughput:7.1f}"
            f" {step.p50_ms:7.1f} {step.p99_ms:7.1f} {step.errors:>6} {req_ratio:>16}"
            f" {p99_ratio:>14} {loop:>11} {proc:>11}"
        )
    ceiling_ratio = _ratio(ferry.throughput if ferry else None, best.seq_per_s)
    lines.append(
        f"{'in-process ORT ceiling':38s} {f'{CORES}x1':>17} {best.seq_per_s:7.1f} {'':7} {'':7}"
        f" {'':6} {ceiling_ratio:>16}   best of {len(best.figures)}: {best.strategy}"
    )
    return "\n".join(lines)


def format_serial(results: list[PeerResult], floors_ms: dict[int, float]) -> str:
    lines = [
        f"{'peer':38s} {'threads':>7} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'in-process batch 1, same threads':>33} {'loop ms/req':>11}"
    ]
    for result in results:
        if result.serial is None:
            lines.append(f"{result.name:38s} {result.skipped}")
            continue
        s, threads = result.serial, result.threads.serial
        floor = floors_ms[threads]
        loop, _ = _cpu(result.cpu.get("serial"))
        lines.append(
            f"{result.name:38s} {threads:>7} {s.p50_ms:7.2f} {s.p99_ms:7.2f}"
            f" {f'{floor:.2f} ms, p50 {s.p50_ms - floor:+.2f} ms':>33} {loop:>11}"
        )
    return "\n".join(lines)


def format_summary(sets: tuple[InputSet, ...], results: list[PeerResult], ceilings: dict) -> str:
    """Ferry's ratios to the ceiling and to each direct peer, one line per input set."""
    ferry = _ferry(results)
    by_name = {r.name: r for r in results}
    lines = []
    for input_set in sets:
        own = ferry.loaded.get(input_set.name)
        if own is None:
            lines.append(f"{input_set.name}: ferry has no figures ({ferry.skipped})")
            continue
        parts = [f"ceiling {_ratio(own.throughput, ceilings[input_set.name].seq_per_s)}"]
        for name in (UNBATCHED, TRITON, LITSERVE, MOSEC):
            step = by_name[name].loaded.get(input_set.name) if name in by_name else None
            if step is not None:
                parts.append(
                    f"{name} {_ratio(own.throughput, step.throughput)}"
                    f" (p99 {own.p99_ms:.0f} vs {step.p99_ms:.0f} ms)"
                )
        loop, proc = _cpu(ferry.cpu.get(input_set.name))
        parts.append(f"loop CPU {loop} ms/req, process CPU {proc} ms/req")
        lines.append(f"{input_set.name}: ferry / " + "; ".join(parts))
    return "\n".join(lines)


def _ferry(results: list[PeerResult]) -> PeerResult:
    return next(r for r in results if r.name == FERRY)


def _cpu(cpu: CpuPerRequest | None) -> tuple[str, str]:
    if cpu is None:
        return "-", "-"
    loop = "-" if cpu.loop_ms is None else f"{cpu.loop_ms:.3f}"
    return loop, f"{cpu.process_ms:.2f}"


def _ratio(ferry: float | None, peer: float) -> str:
    return f"{ferry / peer:.2f}x" if ferry is not None and peer else "-"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--mixed-requests", type=int, default=1500, help="Mixed inputs, per peer.")
    parser.add_argument("--short-requests", type=int, default=4000, help="Short inputs, per peer.")
    parser.add_argument(
        "--serial-requests", type=int, default=200, help="One-client requests, per peer."
    )
    parser.add_argument("--concurrency", type=int, default=64, help="Clients for the loaded runs.")
    parser.add_argument("--warmup", type=int, default=128, help="Requests before each run.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--no-triton", action="store_true", help="Skip the three Triton peers.")
    parser.add_argument(
        "--no-litserve-mosec", action="store_true", help="Skip the LitServe and Mosec peers."
    )
    parser.add_argument(
        "--triton-protocol",
        choices=["grpc", "http"],
        default="grpc",
        help="How Ferry's Triton backend talks to Triton (Triton's direct clients use HTTP).",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    sets = (
        InputSet("mixed", token_sequences(args.mixed_requests, 8, 128, args.seed)),
        InputSet("short", token_sequences(args.short_requests, 8, 16, args.seed)),
    )
    plan = Plan(sets, sets[0].inputs[: args.serial_requests], args.concurrency, args.warmup)
    onnx = args.model_dir / "model.onnx"

    # In-process first, while no server shares the cores.
    _progress("in-process ONNX Runtime ...")
    ceilings = {s.name: ceiling(onnx, s.inputs) for s in sets}
    floors_ms = {t: batch1_p50_ms(onnx, plan.serial_inputs, t) for t in sorted({1, CORES})}

    results = [
        run_peer(FERRY, ferry_threads(), lambda: ferry_peer(default_model_config()), plan),
        run_peer(
            UNBATCHED,
            Threads(f"{CORES}x{THREADS_PER_SESSION}", THREADS_PER_SESSION),
            lambda: unbatched_peer(args.model_dir),
            plan,
        ),
    ]
    if args.no_triton:
        results += [PeerResult("Triton (all three peers)", Threads("-", 1), skipped="--no-triton")]
    else:
        results += run_triton_peers(args.model_dir, plan, args.triton_protocol)
    if args.no_litserve_mosec:
        skipped = PeerResult("LitServe, Mosec", Threads("-", 1), skipped="--no-litserve-mosec")
        results.append(skipped)
    else:
        # One session of every core behind each batcher: 1 x CORES, alone or loaded.
        threads = Threads(f"1x{CORES}", CORES)
        for name, module in BATCHED_PEERS.items():
            start = functools.partial(framework_peer, module, args.model_dir)
            results.append(run_peer(name, threads, start, plan))

    print(f"\n{args.concurrency} concurrent clients, closed loop; ratios are Ferry's to each peer")
    print("threads: ONNX Runtime sessions x intra-op threads; loop: the server's main thread;")
    print("proc: the server process's CPU (LitServe, Mosec: all of their processes together)")
    print("(a shared machine makes absolute figures noisy: compare within this run)")
    for input_set in sets:
        print(f"\n== {input_set.describe} ==")
        print(format_loaded(input_set, results, ceilings[input_set.name]))
    print(f"\n== one client at a time: {len(plan.serial_inputs)} mixed requests ==")
    print(format_serial(results, floors_ms))
    print("\n== summary ==")
    print(format_summary(sets, results, ceilings))
    print(f"\ntotal {time.perf_counter() - began:.0f}s")
    failed = [r for r in results if r.failed]
    for result in failed:
        print(f"{result.name}: {result.skipped}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
