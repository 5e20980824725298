"""`api_servers` 1 against N: the front end's ceiling and what each process spends per request.

Every level serves all-MiniLM-L6-v2's tokenizer and shapes on the null backend (no compute:
bench/null_backend.py), so the figures are the front end's alone. For each level, one load of
short /predict requests at saturation, and CPU per completed request from /proc:
  engine loop    the engine process's event-loop thread (target <= 0.05 ms: one loop feeds
                 20,000 req/s); at level 1 the one process's loop, which does everything
  API            all API processes together (parse, validate, tokenize, render, HTTP)
and the capacity the split projects on a host of `--cores` cores: the engine loop's bound
(1000 / engine-loop ms) or the API processes' (cores - 1 for the engine, / API ms), whichever
is lower. The load generator runs on the same machine: wrk by default (bench/wrk_load.py: C, a
small share of a core), `--loadgen python` for bench/loadgen.py, which takes about a core of
its own on a 2-core box and so hides whether a second process gains anything.

`--real` serves the real model instead (ONNX Runtime on the same cores: what the split costs or
gains where the model needs the CPU), `--lengths 8,128` for mixed inputs.

`--replicas` reads the levels as `replicas` instead: N whole servers on one port, no engine
process. The API column is then the replicas' CPU a request, and the capacity that of the
cores they can use (min(N, cores) x 1000 / API ms).

python -m ferry.bench.api_servers [--levels 1,2] [--duration 10] [--concurrency 64] [--cores 16]
                                  [--real] [--lengths 8,16] [--replicas] [--loadgen wrk]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ferry.bench.inputs import token_sequences
from ferry.bench.process_cpu import process_cpu_s, thread_cpu_s
from ferry.bench.server_process import default_model_config, ferry_server
from ferry.bench.wrk_load import closed_loop
from ferry.server.procs.process_role import ROLE_ENV

ROLE_ENTRY = f"{ROLE_ENV}=".encode()


def process_roles(pid: int) -> dict[int, str]:
    """A server's living child processes by FERRY_PROCESS (`engine`, `api`, `replica`), from
    /proc."""
    found = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except (ProcessLookupError, FileNotFoundError):  # died (a zombie until it is reaped)
            continue
        for entry in environ:
            if entry.startswith(ROLE_ENTRY):
                found[int(child)] = entry[len(ROLE_ENTRY) :].decode()
    return found


@dataclass(frozen=True)
class Level:
    api_servers: int  # or replicas, where `replicas`
    throughput: float
    engine_loop_ms: float
    engine_process_ms: float
    api_ms: float
    replicas: bool = False

    def capacity(self, cores: int) -> float:
        """Requests per second the split sustains on `cores` cores, by the CPU it spent."""
        engine_bound = 1000 / self.engine_loop_ms if self.engine_loop_ms else float("inf")
        if self.api_servers == 1:  # one process: its loop does everything
            return engine_bound
        if self.replicas:  # each replica's loop does everything for its share
            return min(self.api_servers, cores) * 1000 / self.api_ms
        return min(engine_bound, (cores - 1) * 1000 / self.api_ms)

    def row(self, cores: int) -> str:
        return (
            f"{self.api_servers:>11} {self.throughput:>9.0f} {self.engine_loop_ms:>15.4f} "
            f"{self.engine_process_ms:>15.4f} {self.api_ms:>9.4f} {self.capacity(cores):>13.0f}"
        )


def _cpu(pids: dict[str, list[int]]) -> tuple[float, float, float]:
    engine = pids["engine"][0] if pids["engine"] else None  # none with replicas
    return (
        thread_cpu_s(engine) if engine else 0.0,
        process_cpu_s(engine) if engine else 0.0,
        sum(process_cpu_s(p) for p in pids["api"]),
    )


def measure(
    level: int,
    bodies: list[dict],
    duration_s: float,
    concurrency: int,
    real: bool = False,
    replicas: bool = False,
    loadgen: str = "wrk",
) -> Level:
    model = default_model_config(batching={"max_batch_size": 64, "max_queue_size": 4096})
    module = "ferry" if real else "ferry.bench.null_backend"
    layout = {"replicas" if replicas else "api_servers": level}
    with ferry_server([model], server=layout, module=module) as server:
        assert server.pid is not None
        if level == 1:
            pids = {"engine": [server.pid], "api": []}
        else:
            children = level if replicas else level + 1
            deadline = time.monotonic() + 60
            while len(roles := process_roles(server.pid)) < children:
                assert time.monotonic() < deadline, "the server's processes did not start"
                time.sleep(0.1)
            pids = {r: [p for p, v in roles.items() if v == r] for r in ("engine", "api")}
            if replicas:  # every replica is a whole server: its CPU goes in the API column
                pids["api"] = [p for p, v in roles.items() if v == "replica"]
        closed_loop(server.url, bodies, concurrency, "/predict", min(2.0, duration_s), loadgen)
        before = _cpu(pids)
        result = closed_loop(server.url, bodies, concurrency, "/predict", duration_s, loadgen)
        after = _cpu(pids)
    n = max(result.statuses.get(200, 0), 1)
    loop, process, api = ((a - b) * 1000 / n for a, b in zip(after, before, strict=True))
    return Level(level, result.throughput, loop, process, api, replicas)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,2", help="api_servers values, comma-separated")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per level")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--cores", type=int, default=16, help="host size for the projection")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real", action="store_true", help="the real model, not the null one")
    parser.add_argument("--lengths", default="8,16", help="token lengths: min,max")
    parser.add_argument(
        "--replicas", action="store_true", help="the levels are replicas, not api_servers"
    )
    parser.add_argument("--loadgen", choices=("wrk", "python"), default="wrk")
    args = parser.parse_args(argv)
    setting = "replicas" if args.replicas else "api_servers"
    low, high = (int(x) for x in args.lengths.split(","))
    bodies = [{"input_ids": ids} for ids in token_sequences(2000, low, high, args.seed)]
    levels = [int(x) for x in args.levels.split(",")]
    print(
        f"/predict of {low}-{high} tokens on the {'real' if args.real else 'null'} backend, "
        f"{args.concurrency} clients, "
        f"{args.duration:g} s per level; CPU ms per request; capacity on {args.cores} cores"
    )
    print(f"{setting:>11}     req/s  engine loop ms  engine proc ms    API ms  capacity r/s")
    results = []
    for level in levels:
        layout = {"real": args.real, "replicas": args.replicas, "loadgen": args.loadgen}
        results.append(measure(level, bodies, args.duration, args.concurrency, **layout))
        print(results[-1].row(args.cores), flush=True)
    base = results[0]
    for result in results[1:]:
        print(
            f"{setting} {result.api_servers} / {base.api_servers}: "
            f"throughput x{result.throughput / base.throughput:.2f}, "
            f"projected capacity x{result.capacity(args.cores) / base.capacity(args.cores):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
