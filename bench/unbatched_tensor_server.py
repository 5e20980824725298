"""The strong unbatched peer for any ONNX graph, on KServe v2 JSON: bench/unbatched_server.py's
recipe (one session of one thread per core, handed out to a thread pool of the same size, orjson
in and out, no access log) with tensors in and out instead of token ids.

python -m ferry.bench.unbatched_tensor_server --model PATH --name NAME [--port 8011]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
from fastapi import FastAPI, Request, Response

from ferry.backends.ort_session import session_options

# KServe v2 datatype of each numpy dtype an ONNX graph's inputs and outputs use here.
DATATYPES = {"float32": "FP32", "float64": "FP64", "int64": "INT64", "int32": "INT32"}
NUMPY = {v: k for k, v in DATATYPES.items()}


def create_app(model: Path, name: str, sessions: int) -> FastAPI:
    import onnxruntime as ort

    idle: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(sessions):
        idle.put(ort.InferenceSession(str(model), session_options(1)))
    all_outputs = [o.name for o in ort.InferenceSession(str(model)).get_outputs()]
    pool = ThreadPoolExecutor(sessions, thread_name_prefix="ort")

    def run(feeds: dict[str, np.ndarray], outputs: list[str] | None) -> list[np.ndarray]:
        session = idle.get()  # never waits: the pool has as many threads as sessions
        try:
            return session.run(outputs, feeds)
        finally:
            idle.put(session)

    app = FastAPI(title="unbatched ONNX Runtime peer (KServe v2)")

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(b'{"ready":true}', media_type="application/json")

    @app.post(f"/v2/models/{name}/infer")
    async def infer(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
            feeds = {
                t["name"]: np.asarray(t["data"], dtype=NUMPY[t["datatype"]]).reshape(t["shape"])
                for t in body["inputs"]
            }
            wanted = [o["name"] for o in body.get("outputs", [])] or None
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return Response(orjson.dumps({"error": str(exc)}), 400)
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(pool, run, feeds, wanted)
        names = wanted or all_outputs
        outputs = [
            {
                "name": out_name,
                "datatype": DATATYPES[str(array.dtype)],
                "shape": list(array.shape),
                "data": array.ravel(),
            }
            for out_name, array in zip(names, results, strict=True)
        ]
        answer = {"model_name": name, "outputs": outputs}
        return Response(
            orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY),
            media_type="application/json",
        )

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="ONNX model file.")
    parser.add_argument("--name", required=True, help="The model's name in /v2/models/NAME.")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--sessions", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    app = create_app(args.model, args.name, args.sessions)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
