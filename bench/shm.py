"""A 224x224 image tensor (3 x 224 x 224 FP32, 602,112 bytes) to Ferry by system shared memory
against the same tensor as KServe v2 binary HTTP: req/s and p50, and their ratio, in one run.

    python -m ferry.bench.shm [--duration 5] [--clients 4] [--rounds 2]
        [--api-servers 2 [--engine-shm-min-bytes 0]]

The model is a graph that only averages each channel (ImageMean), so the figures are the
transport's: by binary HTTP every request carries the 602 KB tensor through the socket; by
shared memory it carries a ~300-byte JSON header naming the client's region (created with
tritonclient.utils.shared_memory, registered over HTTP), the server reads the tensor from
the mapping and writes the answer into the client's output region. Each client keeps one
keep-alive connection and sends its next request when the last is answered (closed loop); the
two transports alternate for `--rounds` rounds, on one server (allow_client_shm = true).
With `--api-servers 2` the tensor then crosses from the API process to the engine process too:
through the API process's arena (server/procs/arena.py), or through the socket with
`--engine-shm-min-bytes 0`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

MODEL = "image_mean"
SIDE = 224
SHAPE = [1, 3, SIDE, SIDE]
IMAGE_BYTES = 3 * SIDE * SIDE * 4
OUTPUT_BYTES = 3 * 4
HEADER_LENGTH = "Inference-Header-Content-Length"


def image_mean(path: Path) -> Path:
    """input [N, 3, 224, 224] FP32 -> mean [N, 3]: each channel's average."""
    import onnx
    from onnx import TensorProto, helper

    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3])
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["axes"], value=axes),
            helper.make_node("ReduceMean", ["input", "axes"], ["mean"], keepdims=0),
        ],
        MODEL,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, SIDE, SIDE])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["N", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(SHAPE, dtype=np.float32)


def binary_request(array: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """KServe v2 binary: a JSON header, then the tensor's bytes."""
    header = {
        "inputs": [
            {
                "name": "input",
                "shape": SHAPE,
                "datatype": "FP32",
                "parameters": {"binary_data_size": array.nbytes},
            }
        ],
        "outputs": [{"name": "mean", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header).encode()
    headers = {HEADER_LENGTH: str(len(head)), "Content-Type": "application/octet-stream"}
    return head + array.tobytes(), headers


def shm_request(input_region: str, output_region: str) -> tuple[bytes, dict[str, str]]:
    """The same request, its tensor and answer in shared memory regions."""
    header = {
        "inputs": [
            {
                "name": "input",
                "shape": SHAPE,
                "datatype": "FP32",
                "parameters": {
                    "shared_memory_region": input_region,
                    "shared_memory_byte_size": IMAGE_BYTES,
                },
            }
        ],
        "outputs": [
            {
                "name": "mean",
                "parameters": {
                    "shared_memory_region": output_region,
                    "shared_memory_byte_size": OUTPUT_BYTES,
                },
            }
        ],
    }
    return json.dumps(header).encode(), {"Content-Type": "application/json"}


@dataclass
class Client:
    """One closed-loop client: its request, and how to check an answer."""

    body: bytes
    headers: dict[str, str]
    answer: Callable[[httpx.Response], np.ndarray]


@contextmanager
def shm_clients(url: str, count: int, array: np.ndarray) -> Iterator[list[Client]]:
    """`count` clients, each with its own input and output regions (registered, then
    unregistered and destroyed on exit)."""
    import tritonclient.utils.shared_memory as shm

    with httpx.Client(base_url=url) as http, ExitStack() as stack:
        clients = []
        for index in range(count):
            names = f"bench_in_{index}", f"bench_out_{index}"
            handles = []
            for name, size in zip(names, (IMAGE_BYTES, OUTPUT_BYTES), strict=True):
                handle = shm.create_shared_memory_region(name, f"/ferry_{name}", size)
                stack.callback(shm.destroy_shared_memory_region, handle)
                handles.append(handle)
                body = {"key": f"/ferry_{name}", "offset": 0, "byte_size": size}
                path = f"/v2/systemsharedmemory/region/{name}/register"
                http.post(path, json=body).raise_for_status()
                stack.callback(http.post, f"/v2/systemsharedmemory/region/{name}/unregister")
            shm.set_shared_memory_region(handles[0], [array])
            output = handles[1]

            def answer(_: httpx.Response, output: object = output) -> np.ndarray:
                return shm.get_contents_as_numpy(output, np.float32, [1, 3])

            clients.append(Client(*shm_request(*names), answer))
        yield clients


def binary_clients(count: int, array: np.ndarray) -> list[Client]:
    def answer(response: httpx.Response) -> np.ndarray:
        size = int(response.headers[HEADER_LENGTH])
        return np.frombuffer(response.content[size:], dtype=np.float32).reshape(1, 3)

    return [Client(*binary_request(array), answer) for _ in range(count)]


@dataclass
class Result:
    latencies_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies_s) / self.elapsed_s

    @property
    def p50_ms(self) -> float:
        return float(np.percentile(self.latencies_s, 50) * 1000)


def load(url: str, clients: list[Client], duration_s: float, expected: np.ndarray) -> Result:
    """Every client in its own thread, sending for `duration_s`; each answer is checked."""
    path = f"/v2/models/{MODEL}/infer"
    result = Result()
    lock = threading.Lock()
    deadline = time.perf_counter() + duration_s

    def run(client: Client) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            latencies = []
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                response = http.post(path, content=client.body, headers=client.headers)
                latencies.append(time.perf_counter() - started)
                response.raise_for_status()
                np.testing.assert_allclose(client.answer(response), expected, rtol=1e-5)
            with lock:
                result.latencies_s.extend(latencies)

    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.elapsed_s = time.perf_counter() - started
    return result


def measure(url: str, clients: int, duration_s: float, rounds: int) -> dict[str, Result]:
    array = image()
    expected = array.mean(axis=(2, 3))
    results = {"binary HTTP": Result(), "shared memory": Result()}
    with shm_clients(url, clients, array) as by_shm:
        plans = {"binary HTTP": binary_clients(clients, array), "shared memory": by_shm}
        for plan in plans.values():  # warm up both
            load(url, plan, min(duration_s, 1.0), expected)
        for _ in range(rounds):
            for name, plan in plans.items():
                one = load(url, plan, duration_s, expected)
                results[name].latencies_s += one.latencies_s
                results[name].elapsed_s += one.elapsed_s
    return results


def report(results: dict[str, Result], clients: int) -> str:
    lines = [f"shm: {MODEL}, 1 x {SHAPE} FP32 ({IMAGE_BYTES} bytes) a request, {clients} clients"]
    for name, result in results.items():
        lines.append(
            f"  {name:14s} {result.rate:8.1f} req/s  p50 {result.p50_ms:6.2f} ms"
            f"  ({len(result.latencies_s)} requests)"
        )
    shm, binary = results["shared memory"], results["binary HTTP"]
    lines.append(
        f"  shared memory / binary HTTP: req/s {shm.rate / binary.rate:.2f}x, "
        f"p50 {shm.p50_ms / binary.p50_ms:.2f}x"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="Seconds per measurement.")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="Alternations of the transports.")
    parser.add_argument("--api-servers", type=int, default=1, help="The server's api_servers.")
    parser.add_argument(
        "--engine-shm-min-bytes",
        type=int,
        default=None,
        help="With --api-servers > 1: engine_shm_min_bytes (0: tensors cross the socket).",
    )
    args = parser.parse_args(argv)
    from ferry.bench.server_process import ferry_server

    with tempfile.TemporaryDirectory(prefix="ferry-shm-") as tmp:
        model = image_mean(Path(tmp) / f"{MODEL}.onnx")
        server: dict[str, object] = {"allow_client_shm": True, "api_servers": args.api_servers}
        if args.engine_shm_min_bytes is not None:
            server["engine_shm_min_bytes"] = args.engine_shm_min_bytes
        with ferry_server([], server, args=["--model", f"{MODEL}={model}"]) as ferry:
            results = measure(ferry.url, args.clients, args.duration, args.rounds)
    print(f"api_servers = {args.api_servers}, engine_shm_min_bytes = {args.engine_shm_min_bytes}")
    print(report(results, args.clients))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
