"""Ferry against its peers, in one run, on the same inputs, ratios printed from that run.

Peers, each started alone (the machine has 2 cores; nothing else of ours runs beside it):
  ferry                    Ferry's micro-batcher on ONNX Runtime (`ferry serve`)
  unbatched                a plain FastAPI /predict calling ONNX Runtime per request
  triton                   Triton's own dynamic batcher, clients on its KServe v2 HTTP endpoint
  ferry->triton batch      Ferry batches, one Triton request per batch
  ferry->triton pass       Ferry passes each request through; Triton's batcher batches
For mixed (8-128 tokens) and short (8-16 tokens) inputs at 64 clients, then one client at a
time against in-process batch-1 latency. The in-process ONNX Runtime figure is the ceiling.
If Triton cannot start here, its three rows say why and the rest still run.

Other work on the machine makes absolute figures noisy: read the ratios, taken in one run.

python -m ferry.bench.peers [--mixed-requests 1500] [--short-requests 4000] [--no-triton]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from ferry.bench.ceiling import Ceiling, batch1_p50_ms, ceiling
from ferry.bench.inputs import token_sequences
from ferry.bench.sweep import Budget, Step, measure
from ferry.bench.targets import Target
from ferry.bench.triton_peer import TRITON_MODEL, triton_peer
from ferry.bench.unbatched_server import unbatched_server

from tests.server_process import DEFAULT_MODEL_DIR, default_model_config, ferry_server

FERRY = "ferry (onnxruntime)"
STEP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class InputSet:
    name: str
    inputs: list[list[int]]

    @property
    def describe(self) -> str:
        lengths = [len(s) for s in self.inputs]
        return f"{self.name}: {len(lengths)} requests of {min(lengths)}-{max(lengths)} tokens"


@dataclass
class PeerResult:
    name: str
    loaded: dict[str, Step] = field(default_factory=dict)  # input set name -> step
    serial: Step | None = None
    skipped: str = ""  # why the peer has no figures, if it has none


@dataclass(frozen=True)
class Plan:
    sets: tuple[InputSet, ...]
    serial_inputs: list[list[int]]
    concurrency: int
    warmup: int


async def measure_peer(name: str, target: Target, plan: Plan) -> PeerResult:
    result = PeerResult(name)
    for input_set in plan.sets:
        bodies = target.bodies(input_set.inputs)
        if plan.warmup:
            warm = Budget(plan.warmup, None, STEP_TIMEOUT_S)
            await measure(target, bodies, plan.concurrency, warm)
        budget = Budget(len(bodies), None, STEP_TIMEOUT_S)
        step = await measure(target, bodies, plan.concurrency, budget)
        result.loaded[input_set.name] = step
        _progress(f"  {name}, {input_set.name}: {step.throughput:.1f} req/s")
    serial = target.bodies(plan.serial_inputs)
    result.serial = await measure(target, serial, 1, Budget(len(serial), None, STEP_TIMEOUT_S))
    return result


def run_peer(
    name: str, start: Callable[[], AbstractContextManager[Target]], plan: Plan
) -> PeerResult:
    """Start the peer, measure it, stop it; a peer that fails is reported, not fatal."""
    _progress(f"{name} ...")
    began = time.perf_counter()
    try:
        with start() as target:
            result = asyncio.run(measure_peer(name, target, plan))
    # Broad on purpose: one broken peer must not end the comparison of the others.
    except Exception as exc:
        _progress(f"{name}: failed: {exc!r}")
        return PeerResult(name, skipped=_one_line(exc))
    _progress(f"{name}: done in {time.perf_counter() - began:.0f}s")
    return result


@contextlib.contextmanager
def ferry_peer(model: dict) -> Iterator[Target]:
    with ferry_server([model]) as server:
        yield Target(server.url, "predict")


@contextlib.contextmanager
def unbatched_peer(model_dir: Path) -> Iterator[Target]:
    with unbatched_server(model_dir / "model.onnx") as url:
        yield Target(url, "predict")


@contextlib.contextmanager
def given(target: Target) -> Iterator[Target]:
    yield target


def run_triton_peers(model_dir: Path, plan: Plan, protocol: str) -> list[PeerResult]:
    names = ("triton dynamic batcher", "ferry -> triton (batch)", "ferry -> triton (passthrough)")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        try:
            triton = stack.enter_context(triton_peer(model_dir, Path(tmp)))
        # Broad on purpose: whatever keeps Triton from starting here, say why and go on.
        except Exception as exc:
            why = f"Triton did not start: {_one_line(exc)}"
            _progress(why)
            return [PeerResult(name, skipped=why) for name in names]
        direct = Target(f"http://{triton.http_url}", "kserve", TRITON_MODEL)
        results = [run_peer(names[0], lambda: given(direct), plan)]
        for name, mode in zip(names[1:], ("batch", "passthrough"), strict=True):
            model = default_model_config(
                backend="triton",
                triton_url=triton.url(protocol),
                triton_protocol=protocol,
                triton_model=TRITON_MODEL,
                triton_mode=mode,
            )
            results.append(run_peer(name, lambda m=model: ferry_peer(m), plan))
    return results


def format_loaded(input_set: InputSet, results: list[PeerResult], best: Ceiling) -> str:
    ferry = next((r.loaded.get(input_set.name) for r in results if r.name == FERRY), None)
    lines = [
        f"{'peer':32s} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
        f" {'ferry/peer req/s':>17} {'ferry/peer p99':>15}"
    ]
    for result in results:
        step = result.loaded.get(input_set.name)
        if step is None:
            lines.append(f"{result.name:32s} skipped: {result.skipped}")
            continue
        req_ratio = _ratio(ferry.throughput if ferry else None, step.throughput)
        p99_ratio = _ratio(ferry.p99_ms if ferry else None, step.p99_ms)
        lines.append(
            f"{result.name:32s} {step.throughput:8.1f} {step.p50_ms:8.1f} {step.p99_ms:8.1f}"
            f" {step.errors:>6} {req_ratio:>17} {p99_ratio:>15}"
        )
    ceiling_ratio = _ratio(ferry.throughput if ferry else None, best.seq_per_s)
    lines.append(
        f"{'in-process ORT ceiling':32s} {best.seq_per_s:8.1f} {'':8} {'':8} {'':6}"
        f" {ceiling_ratio:>17}   ({best.strategy})"
    )
    return "\n".join(lines)


def format_serial(results: list[PeerResult], floor_ms: float) -> str:
    lines = [f"{'peer':32s} {'p50 ms':>8} {'p99 ms':>8} {'vs in-process batch 1':>22}"]
    for result in results:
        if result.serial is None:
            lines.append(f"{result.name:32s} skipped")
            continue
        s = result.serial
        lines.append(
            f"{result.name:32s} {s.p50_ms:8.2f} {s.p99_ms:8.2f} {s.p50_ms - floor_ms:+19.2f} ms"
        )
    lines.append(f"{'in-process ORT batch 1':32s} {floor_ms:8.2f}")
    return "\n".join(lines)


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
    floor_ms = batch1_p50_ms(onnx, plan.serial_inputs)

    results = [
        run_peer(FERRY, lambda: ferry_peer(default_model_config()), plan),
        run_peer("plain FastAPI + ORT (unbatched)", lambda: unbatched_peer(args.model_dir), plan),
    ]
    if args.no_triton:
        results += [PeerResult("triton (all three peers)", skipped="--no-triton")]
    else:
        results += run_triton_peers(args.model_dir, plan, args.triton_protocol)

    print(f"\n{args.concurrency} concurrent clients, closed loop; ratios are Ferry's to each peer")
    print("(a shared machine makes absolute figures noisy: compare within this run)")
    for input_set in sets:
        print(f"\n== {input_set.describe} ==")
        print(format_loaded(input_set, results, ceilings[input_set.name]))
    print(f"\n== one client at a time: {len(plan.serial_inputs)} mixed requests ==")
    print(format_serial(results, floor_ms))
    print(f"\ntotal {time.perf_counter() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
