"""Tabular serving (issue 34's first target): scikit-learn's gradient boosting on the breast-cancer
data (569 x 30, shipped in scikit-learn's wheel), one row per request, 64 clients, KServe v2
JSON on every server, so the load generator cannot tell them apart:

- Ferry, `ferry serve --model gb=model.onnx`: the graph's own signature, its batcher;
- the strong unbatched server: one ONNX Runtime session of one thread per core, handed out to a
  thread pool of the same size, orjson, no access log (bench/unbatched_server.py's recipe);
- Triton's CPU build: python backend running ONNX Runtime, its dynamic batcher (up to 32, a
  2 ms window) over two instances of one thread, as Ferry runs two sessions of one thread.

All three are up at once and measured in alternating rounds (`--rounds`, who goes first
alternating): on this box separate runs drift by 20-40 %, more than most changes. Prints req/s and
p50/p99 of each, pooled over its rounds, Ferry's ratios to each peer (pooled and each round's),
and the CPU Ferry spent per request in its rounds, all from one run.

    python -m ferry.bench.tabular [--duration 15] [--rounds 3] [--clients 64] [--api-servers N]
                                  [--replicas N] [--loadgen wrk]

The load comes from wrk (bench/wrk_load.py), which leaves the cores to the servers; `--loadgen
python` for bench/loadgen.py, which takes about a core of the 2-core box and so caps every
server that could use both (Triton's C++ front end, Ferry's replicas).

Ferry runs in the layout it chooses for this model and host (server/layout_choice.py; printed
from its start-up log) unless `--api-servers N` (N API processes in front of one engine process)
or `--replicas N` (N whole servers on one port, each its own model, batcher and sessions) sets
one. With more than one process its CPU per request is that of the whole process tree (no one
event loop to single out).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ferry.bench.interleaved import block_order
from ferry.bench.loadgen import LoadResult, merge
from ferry.bench.process_cpu import CpuPerRequest, CpuSample
from ferry.bench.processes import ManagedProcess, free_port, http_ok, running
from ferry.bench.wrk_load import closed_loop

MODEL = "gb"
INPUT, OUTPUT = "float_input", "probabilities"
TRITON_BATCH, TRITON_DELAY_US, TRITON_INSTANCES = 32, 2000, 2


def export_model(out: Path) -> tuple[Path, np.ndarray]:
    """The fitted classifier as ONNX (probabilities as a tensor, no ZipMap), and its rows."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import GradientBoostingClassifier

    x, y = load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    estimator = GradientBoostingClassifier(n_estimators=100, random_state=0).fit(x, y)
    onnx = to_onnx(estimator, x[:1], options={"zipmap": False}, target_opset=15)
    onnx.graph.input[0].name = INPUT  # skl2onnx names it X
    for node in onnx.graph.node:
        node.input[:] = [INPUT if name == "X" else name for name in node.input]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.onnx"
    path.write_bytes(onnx.SerializeToString())
    return path, x


def bodies(rows: np.ndarray) -> list[dict]:
    return [
        {
            "inputs": [
                {"name": INPUT, "shape": [1, rows.shape[1]], "datatype": "FP32", "data": r.tolist()}
            ],
            "outputs": [{"name": OUTPUT}],
        }
        for r in rows
    ]


def ferry_process(
    model: Path,
    work: Path,
    name: str = MODEL,
    api_servers: int | None = None,
    replicas: int | None = None,
    direct_lane: bool = True,
) -> ManagedProcess:
    """Ferry serving `model`, in the layout given, or else the one it chooses; without its
    direct lane (server/direct_lane.py) where `direct_lane` is false."""
    port = free_port()
    layout = {"FERRY_API_SERVERS": api_servers, "FERRY_REPLICAS": replicas}
    if not direct_lane:
        layout["FERRY_DIRECT_LANE"] = "false"
    command = [sys.executable, "-m", "ferry", "serve", "--model", f"{name}={model}"]
    command += ["--port", str(port)]
    return ManagedProcess(
        "ferry",
        command,
        work / ("ferry.log" if direct_lane else "ferry-gateway.log"),
        http_ok(f"http://127.0.0.1:{port}/health/ready"),
        url=f"http://127.0.0.1:{port}",
        env={**os.environ, **{k: str(v) for k, v in layout.items() if v is not None}},
    )


def chosen_layout(log: Path) -> str:
    """The layout and its reason, from Ferry's start-up log (server/cli.py's `layout`)."""
    for line in log.read_text(errors="replace").splitlines():
        if "ferry: " in line and ("(replicas = " in line or "(api_servers = " in line):
            return line.split("ferry: ", 1)[1]
    return "not in the log"


def unbatched_process(model: Path, work: Path, name: str = MODEL) -> ManagedProcess:
    port = free_port()
    command = [sys.executable, "-m", "ferry.bench.unbatched_tensor_server"]
    command += ["--model", str(model), "--name", name, "--port", str(port)]
    return ManagedProcess(
        "unbatched",
        command,
        work / "unbatched.log",
        http_ok(f"http://127.0.0.1:{port}/v2/health/ready"),
        url=f"http://127.0.0.1:{port}",
    )


TRITON_MODEL_PY = """
import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        folder = args["model_repository"] + "/" + args["model_version"]
        self.session = ort.InferenceSession(folder + "/model.onnx", options)

    def execute(self, requests):
        rows = [pb_utils.get_input_tensor_by_name(r, "{input}").as_numpy() for r in requests]
        out = self.session.run(["{output}"], {{"{input}": np.concatenate(rows)}})[0]
        answers, start = [], 0
        for r in rows:
            piece = out[start : start + len(r)]
            start += len(r)
            tensor = pb_utils.Tensor("{output}", piece)
            answers.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return answers
"""


def triton_repository(model: Path, features: int, classes: int, repository: Path) -> None:
    folder = repository / MODEL
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.onnx").write_bytes(model.read_bytes())
    (folder / "1" / "model.py").write_text(TRITON_MODEL_PY.format(input=INPUT, output=OUTPUT))
    (folder / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "python"\nmax_batch_size: {TRITON_BATCH}\n'
        f'input [ {{ name: "{INPUT}" data_type: TYPE_FP32 dims: [ {features} ] }} ]\n'
        f'output [ {{ name: "{OUTPUT}" data_type: TYPE_FP32 dims: [ {classes} ] }} ]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {TRITON_DELAY_US} }}\n"
        f"instance_group [ {{ count: {TRITON_INSTANCES} kind: KIND_CPU }} ]\n"
    )


@contextlib.contextmanager
def triton_process(model: Path, rows: np.ndarray, work: Path) -> Iterator[str | None]:
    """Triton's URL, or None (with the reason printed) where its CPU build cannot start."""
    from ferry.bench.processes import triton_server
    from ferry.bench.triton_env import ensure

    try:
        layout = ensure()
        triton_repository(model, rows.shape[1], 2, work / "triton-repo")
        with triton_server(work / "triton-repo", work, layout) as server:
            yield f"http://{server.http_url}"
    except (OSError, RuntimeError) as exc:
        print(f"triton: not measured ({exc})")
        yield None


def measure(
    url: str,
    payloads: list[dict],
    clients: int,
    duration_s: float,
    name: str = MODEL,
    loadgen: str = "wrk",
) -> LoadResult:
    path = f"/v2/models/{name}/infer"
    closed_loop(url, payloads, clients, path, 1.0, loadgen)  # warm up
    return closed_loop(url, payloads, clients, path, duration_s, loadgen)


def line(name: str, result: LoadResult) -> str:
    p50, p99 = result.percentile_ms(50), result.percentile_ms(99)
    failed = {status: n for status, n in result.statuses.items() if status != 200}
    return f"{name:>10}: {result.throughput:8.1f} req/s  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms" + (
        f"  not 200: {failed}" if failed else ""
    )


def ratios(label: str, ours: LoadResult, theirs: LoadResult) -> str:
    """Ours over theirs: throughput and p99, as every any-ONNX benchmark prints them."""
    throughput = ours.throughput / theirs.throughput
    p99 = ours.percentile_ms(99) / theirs.percentile_ms(99)
    return f"{label}: {throughput:.2f}x req/s, p99 {p99:.2f}x"


def measure_rounds(
    urls: dict[str, str],
    payloads: list[dict],
    clients: int,
    round_s: float,
    rounds: int,
    loadgen: str,
    ferry: CpuWindows,
) -> dict[str, list[LoadResult]]:
    """Every server, all up at once, warmed up, then `rounds` rounds of `round_s` each, who goes
    first alternating (bench/interleaved.py): this box's load drifts by 20-40 % over a minute,
    and rounds seconds apart on every side suffer it alike. Ferry's CPU counted in its rounds."""
    path = f"/v2/models/{MODEL}/infer"
    for url in urls.values():
        closed_loop(url, payloads, clients, path, 1.0, loadgen)
    loads: dict[str, list[LoadResult]] = {name: [] for name in urls}
    for index in range(rounds):
        for name in block_order(index, list(urls)):
            before = ferry.sample() if name == "ferry" else None
            loads[name].append(closed_loop(urls[name], payloads, clients, path, round_s, loadgen))
            if before is not None:
                ferry.add(before, loads[name][-1].completed)
    return loads


class CpuWindows:
    """A process's (or process tree's) CPU summed over the windows it was measured in."""

    def __init__(self, pid: int, tree: bool) -> None:
        self._pid, self._tree = pid, tree
        self._loop_s: float | None = None if tree else 0.0
        self._process_s = 0.0
        self._requests = 0

    def sample(self) -> CpuSample:
        return CpuSample.of(self._pid, self._tree)

    def add(self, before: CpuSample, requests: int) -> None:
        after = self.sample()
        if self._loop_s is not None and after.loop_s is not None and before.loop_s is not None:
            self._loop_s += after.loop_s - before.loop_s
        self._process_s += after.process_s - before.process_s
        self._requests += requests

    def per_request(self) -> CpuPerRequest:
        return CpuPerRequest.between(
            CpuSample(None if self._loop_s is None else 0.0, 0.0),
            CpuSample(self._loop_s, self._process_s),
            self._requests,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration", type=float, default=15.0, help="Seconds per server, over all its rounds."
    )
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds per server.")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument(
        "--api-servers", type=int, help="Ferry's API processes (default: Ferry's choice)."
    )
    parser.add_argument("--replicas", type=int, help="Ferry's replicas (default: Ferry's choice).")
    parser.add_argument("--loadgen", choices=("wrk", "python"), default="wrk")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ferry-tabular-") as tmp, contextlib.ExitStack() as up:
        work = Path(tmp)
        model, rows = export_model(work / "model")
        process = ferry_process(model, work, api_servers=args.api_servers, replicas=args.replicas)
        ferry = up.enter_context(running(process))
        layout = chosen_layout(work / "ferry.log")
        urls = {
            "ferry": ferry.url,
            "unbatched": up.enter_context(running(unbatched_process(model, work))).url,
        }
        triton_url = up.enter_context(triton_process(model, rows, work))
        if triton_url is not None:
            urls["triton"] = triton_url
        # Every process's CPU where there are several: no one event loop to single out.
        cpu = CpuWindows(ferry.pid or 0, tree="one process" not in layout)
        round_s = args.duration / args.rounds
        loads = measure_rounds(
            urls, bodies(rows), args.clients, round_s, args.rounds, args.loadgen, cpu
        )
    print(
        f"tabular: breast-cancer gradient boosting, 1 row/request, {args.clients} clients, "
        f"load from {args.loadgen}, all servers up at once, {args.rounds} alternating rounds of "
        f"{round_s:g} s each\nferry: {layout}"
    )
    results = {name: merge(rounds, elapsed=sum) for name, rounds in loads.items()}
    for name, result in results.items():
        each = " ".join(f"{load.throughput:.1f}" for load in loads[name])
        print(f"{line(name, result)}  rounds: {each}")
    for peer in ("unbatched", "triton"):
        if peer in results:
            each = " ".join(
                f"{a.throughput / b.throughput:.2f}"
                for a, b in zip(loads["ferry"], loads[peer], strict=True)
            )
            print(f"{ratios(f'ferry / {peer}', results['ferry'], results[peer])}; rounds: {each}")
    per_request = cpu.per_request()
    if per_request.loop_ms is None:
        print(f"ferry CPU (every process): {per_request.process_ms:.3f} ms per request")
    else:
        print(f"ferry event-loop CPU: {per_request.loop_ms:.3f} ms per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
