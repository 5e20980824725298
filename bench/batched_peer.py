"""What the LitServe and Mosec peers share: the model behind their batchers, Ferry's /predict
body and answer, their batching settings, and how a benchmark starts one as a process.

Each peer batches with its own framework's batcher in front of ONE ONNX Runtime session using
every core (intra-op threads = cores), and pads each batch to its longest sequence, as Ferry
does; so the comparison is of the batchers and the servers around the same model run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np

from ferry.backends.ort_session import cpu_session
from ferry.batcher.padding import pad_batch
from ferry.batcher.request import TokenSequence
from ferry.bench.process_cpu import process_tree, stat_fields
from ferry.bench.processes import ManagedProcess, Probe, free_port, running

REPO = Path(__file__).resolve().parents[1]
OUTPUT = "sentence_embedding"
PAD_TOKEN_ID = 0  # BERT's [PAD]; the attention mask keeps it out of the pooled embedding
# Batching as both projects' docs have it for a model like this one on a CPU: Ferry's own batch
# limit (32, the largest batch the in-process ceiling tries), and a short wait. Under load the
# batch fills long before the wait ends (64 clients, one batch in flight), so the wait only
# matters at low load, where a lone request pays it in full: both batchers wait for a full batch
# or the timeout. 5 ms is half the 10 ms of Mosec's default and of LitServe's own benchmark
# servers, and below one batch's inference time (Mosec's rule for `max_wait_time`).
MAX_BATCH_SIZE = 32
WAIT_MS = 5
KILL_WAIT_S = 10.0  # for a SIGKILLed worker to end
TIMEOUT_S = 30  # a request's deadline, as Ferry's default model has it (and LitServe's default)


class PaddedEncoder:
    """One session of `threads` intra-op threads; a batch padded to its longest row."""

    def __init__(self, model: Path, threads: int) -> None:
        self.session = cpu_session(model, threads)
        self.name = model.parent.name

    def embed(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """(len(rows), 384) pooled embeddings; row i is rows[i]'s, as if it ran alone."""
        return self.run(pad_rows(rows))

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run([OUTPUT], feeds)[0]

    def answer(self, ids: Sequence[int], embedding: np.ndarray) -> dict:
        """Ferry's /predict answer for one request."""
        usage = {"prompt_tokens": len(ids), "total_tokens": len(ids)}
        return {"model": self.name, "outputs": [{OUTPUT: embedding.tolist()}], "usage": usage}


def pad_rows(rows: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """The model's feeds: each row right-padded to the longest, its mask 0 over the padding
    (Ferry's own padding, so every peer pads exactly as Ferry does)."""
    padded = pad_batch([TokenSequence.from_ids(list(row)) for row in rows], PAD_TOKEN_ID)
    return {"input_ids": padded.input_ids, "attention_mask": padded.attention_mask}


def parse_args(description: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", type=Path, required=True, help="ONNX model file.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8020)
    parser.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE)
    parser.add_argument("--wait-ms", type=int, default=WAIT_MS, help="The batcher's wait.")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="Intra-op.")
    return parser.parse_args(argv)


def predict_ok(url: str) -> Probe:
    """Ready once a real /predict answers: the worker has loaded the model, not just the HTTP
    front (Mosec's and LitServe's own health routes can pass before that)."""

    def probe() -> bool:
        try:
            answer = httpx.post(f"{url}/predict", json={"input_ids": [101, 102]}, timeout=5)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    return probe


@contextlib.contextmanager
def batched_peer(
    module: str,
    model: Path,
    max_batch_size: int = MAX_BATCH_SIZE,
    wait_ms: int = WAIT_MS,
    ready_timeout_s: float = 90.0,
) -> Iterator[ManagedProcess]:
    """`python -m <module>` on a free loopback port; its whole process tree ends with it."""
    port = free_port()
    command = [sys.executable, "-m", module, "--model", str(model), "--port", str(port)]
    command += ["--max-batch-size", str(max_batch_size), "--wait-ms", str(wait_ms)]
    url = f"http://127.0.0.1:{port}"
    name = module.rsplit(".", 1)[-1]
    with tempfile.TemporaryDirectory() as tmp:
        server = ManagedProcess(
            name, command, Path(tmp) / f"{name}.log", predict_ok(url), url, cwd=REPO, grace_s=15
        )
        children: dict[int, str] = {}

        def note_children() -> None:  # at start and before the stop: a worker may be restarted
            children.update((pid, _started(pid)) for pid in process_tree(server.pid or 0)[1:])

        try:
            with running(server, ready_timeout_s):
                note_children()
                try:
                    yield server
                finally:
                    note_children()
        finally:
            _kill_survivors(children)


def _started(pid: int) -> str:
    """When the process started (field 22 of proc(5)): tells it from a later one of its pid."""
    fields = stat_fields(pid)
    return fields[19] if fields else ""


def _kill_survivors(children: dict[int, str]) -> None:
    """Workers the server's own shutdown left behind (a SIGKILLed parent cannot stop them)."""
    killed = []
    for pid, started in children.items():
        if started and _started(pid) == started:  # still ours, not a reused pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    # A kill is delivered, not done: wait until each has ended (gone, or a zombie not reaped
    # yet), so that no worker still holds the cores when the next peer is measured.
    deadline = time.monotonic() + KILL_WAIT_S
    while any(_running(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.01)


def _running(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has ended, only not been reaped
