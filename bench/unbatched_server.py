"""The strong unbatched peer: what a careful engineer serves ONNX Runtime with, without batching.

An async /predict; one ONNX Runtime session of one thread per core, handed out from a queue to a
thread pool of the same size (`InferenceSession.run` releases the GIL, so the cores run side by
side); only `sentence_embedding` fetched; orjson in and out; no access log. Body and answer are
Ferry's /predict ones, so the load generator cannot tell the two apart.

python -m ferry.bench.unbatched_server --model PATH [--port 8010] [--sessions N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import queue
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
from fastapi import FastAPI, Request, Response

from ferry.backends.ort_session import session_options
from ferry.backends.placement import (
    CUDA_EP,
    Device,
    check_session_providers,
    onnxruntime_providers,
)
from ferry.bench.processes import ManagedProcess, free_port, http_ok, running

REPO = Path(__file__).resolve().parents[1]
OUTPUT = "sentence_embedding"
THREADS_PER_SESSION = 1


def create_app(model: Path, sessions: int, device: Device = "cpu") -> FastAPI:
    idle: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(sessions):
        idle.put(_session(model, device))
    pool = ThreadPoolExecutor(sessions, thread_name_prefix="ort")
    name = model.parent.name

    def run(ids: list[int]) -> np.ndarray:
        sess = idle.get()  # never waits: the pool has as many threads as sessions
        try:
            feeds = np.asarray([ids], dtype=np.int64)
            return sess.run([OUTPUT], {"input_ids": feeds, "attention_mask": np.ones_like(feeds)})
        finally:
            idle.put(sess)

    app = FastAPI(title="unbatched ONNX Runtime peer")

    @app.get("/health")
    async def health() -> Response:
        return Response(b'{"ready":true}', media_type="application/json")

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        try:
            ids = orjson.loads(await request.body())["input_ids"]
            valid = bool(ids) and all(type(i) is int for i in ids)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            valid = False
        if not valid:
            return Response(b'{"detail":"input_ids: a non-empty list of integers"}', 422)
        (embedding,) = await asyncio.get_running_loop().run_in_executor(pool, run, ids)
        usage = {"prompt_tokens": len(ids), "total_tokens": len(ids)}
        answer = {"model": name, "outputs": [{OUTPUT: embedding[0]}], "usage": usage}
        body = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
        return Response(body, media_type="application/json")

    return app


def _session(model: Path, device: Device):
    """One 1-thread session; on a GPU the CUDA EP, never a silent fall back to the CPU."""
    import onnxruntime as ort

    providers = onnxruntime_providers(device, ort.get_available_providers(), False, str(model))
    if providers[0] == CUDA_EP:
        ort.preload_dlls()
    options = session_options(THREADS_PER_SESSION)
    sess = ort.InferenceSession(str(model), options, providers=providers)
    check_session_providers(providers, sess.get_providers(), False, str(model))
    return sess


@contextlib.contextmanager
def unbatched_server(
    model: Path,
    sessions: int | None = None,
    ready_timeout_s: float = 180.0,
    device: Device = "cpu",
) -> Iterator[ManagedProcess]:
    """Run the peer as its own uvicorn process on a free loopback port."""
    sessions = sessions or os.cpu_count() or 1
    port = free_port()
    command = [sys.executable, "-m", "ferry.bench.unbatched_server", "--model", str(model)]
    command += ["--port", str(port), "--sessions", str(sessions), "--device", device]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "unbatched.log"
        server = ManagedProcess(
            "unbatched server", command, log, http_ok(f"{url}/health"), url, cwd=REPO, grace_s=10
        )
        with running(server, ready_timeout_s):
            yield server


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="ONNX model file.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument(
        "--sessions", type=int, default=os.cpu_count() or 1, help="1-thread sessions (one a core)."
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    app = create_app(args.model, args.sessions, args.device)
    # uvicorn picks uvloop and httptools when installed, as for Ferry.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
