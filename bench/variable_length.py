"""Variable-length tensors (issue 34's padding target): a masked two-input graph, data
[N, T, 8] FP32 and mask [N, T] INT64 sharing the dynamic axis T, whose answer is the masked mean
of a 8 -> 256 projection with a ReLU (so work grows with T, and padding T changes no answer).
Lengths are drawn log-uniformly from 16 to 4000, 64 clients, KServe v2 JSON on both servers:

- Ferry, `ferry serve --model masked=model.onnx`: batches pad T to each batch's longest row;
- the strong unbatched server (bench/unbatched_tensor_server.py): every request run alone.

Prints req/s and p50/p99 of each and Ferry's ratios, from one run.

    python -m ferry.bench.variable_length [--duration 15] [--clients 64] [--api-servers 1]
"""

from __future__ import annotations

import argparse
import tempfile
from functools import partial
from pathlib import Path

import numpy as np

from ferry.bench.loadgen import LoadResult
from ferry.bench.processes import running
from ferry.bench.tabular import ferry_process, line, measure, ratios, unbatched_process

MODEL = "masked"
FEATURES, HIDDEN = 8, 256
SHORTEST, LONGEST = 16, 4000


def export_model(out: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((FEATURES, HIDDEN)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["data", "w"], ["projected"]),
        helper.make_node("Relu", ["projected"], ["activated"]),
        helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"]),
        helper.make_node("Mul", ["activated", "mask3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "time"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "time"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["mean"]),
    ]
    graph = helper.make_graph(
        nodes,
        "masked_projection",
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", "T", FEATURES]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", "T"]),
        ],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["N", HIDDEN])],
        [
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(np.array([-1], np.int64), "last"),
            numpy_helper.from_array(np.array([1], np.int64), "time"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out.mkdir(parents=True, exist_ok=True)
    path = out / "model.onnx"
    onnx.save(model, path)
    return path


def bodies(count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(SHORTEST), np.log(LONGEST), count)).astype(int)
    return [
        {
            "inputs": [
                {
                    "name": "data",
                    "shape": [1, int(t), FEATURES],
                    "datatype": "FP32",
                    "data": rng.standard_normal(t * FEATURES).round(3).tolist(),
                },
                {"name": "mask", "shape": [1, int(t)], "datatype": "INT64", "data": [1] * t},
            ],
            "outputs": [{"name": "mean"}],
        }
        for t in lengths
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=15.0, help="Seconds per server.")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--bodies", type=int, default=256, help="Distinct requests, sent in turn.")
    parser.add_argument(
        "--api-servers", type=int, default=1, help="Ferry's API processes (api_servers)."
    )
    args = parser.parse_args(argv)
    payloads = bodies(args.bodies)
    results: dict[str, LoadResult] = {}
    with tempfile.TemporaryDirectory(prefix="ferry-variable-") as tmp:
        work = Path(tmp)
        model = export_model(work / "model")
        ferry = partial(ferry_process, api_servers=args.api_servers)
        for name, process in (("ferry", ferry), ("unbatched", unbatched_process)):
            with running(process(model, work, MODEL)) as server:
                results[name] = measure(server.url, payloads, args.clients, args.duration, MODEL)
    print(f"variable length: T from {SHORTEST} to {LONGEST}, {args.clients} clients")
    for name, result in results.items():
        print(line(name, result))
    print(ratios("ferry / unbatched", results["ferry"], results["unbatched"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
