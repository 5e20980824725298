"""The plain peer: a FastAPI /predict that runs ONNX Runtime once per request, no batching.

What most teams write first: a sync route (so FastAPI runs it in its threadpool), one shared
ONNX Runtime session, each request's tokens run alone and unpadded. It answers the same
`/predict` body and response shape as Ferry, so the load generator cannot tell them apart.

python -m ferry.bench.unbatched_server --model PATH [--port 8010] [--threads 1] [--device cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
import numpy as np
from fastapi import FastAPI, HTTPException
from ferry.backends.placement import (
    CUDA_EP,
    Device,
    check_session_providers,
    onnxruntime_providers,
)
from pydantic import BaseModel, StrictInt

REPO = Path(__file__).resolve().parents[1]
OUTPUT = "sentence_embedding"


class PredictBody(BaseModel):
    input_ids: list[StrictInt]
    model: str | None = None


def create_app(model: Path, threads: int = 1, device: Device = "cpu") -> FastAPI:
    import onnxruntime as ort

    # On a GPU, the same session on the CUDA EP; never a silent fall back to the CPU.
    providers = onnxruntime_providers(device, ort.get_available_providers(), False, str(model))
    if providers[0] == CUDA_EP:
        ort.preload_dlls()

    options = ort.SessionOptions()
    # Parallelism comes from the threadpool running requests side by side, as in such servers.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # InferenceSession.run is thread-safe and releases the GIL: one session serves every thread.
    sess = ort.InferenceSession(str(model), options, providers=providers)
    check_session_providers(providers, sess.get_providers(), False, str(model))
    app = FastAPI(title="unbatched ONNX Runtime peer")

    @app.get("/health")
    def health() -> dict:
        return {"ready": True}

    @app.post("/predict")
    def predict(body: PredictBody) -> dict:
        if not body.input_ids:
            raise HTTPException(422, "input_ids is empty")
        ids = np.asarray([body.input_ids], dtype=np.int64)
        (embedding,) = sess.run([OUTPUT], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        tokens = len(body.input_ids)
        return {
            "model": model.parent.name,
            "outputs": [{OUTPUT: embedding[0].tolist()}],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return app


@contextlib.contextmanager
def unbatched_server(
    model: Path, threads: int = 1, ready_timeout_s: float = 60.0, device: Device = "cpu"
) -> Iterator[str]:
    """Run the peer as its own uvicorn process on a free loopback port; yield its URL."""
    from tests.server_process import free_port

    port = free_port()
    command = [sys.executable, "-m", "ferry.bench.unbatched_server", "--model", str(model)]
    command += ["--port", str(port), "--threads", str(threads), "--device", device]
    # A file, not a pipe: nobody reads a pipe while the benchmark runs, and a full one blocks.
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(process, url, ready_timeout_s, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def _wait_ready(process: subprocess.Popen, url: str, timeout_s: float, log: IO[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"unbatched server exited early:\n{log.read()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"unbatched server not ready after {timeout_s}s")


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="ONNX model file.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads.")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    # Same server stack as Ferry (uvicorn picks uvloop and httptools when installed).
    uvicorn.run(
        create_app(args.model, args.threads, args.device),
        host=args.host,
        port=args.port,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
