"""In-process ONNX Runtime on the same inputs: the ceiling a server is measured against."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ferry.backends.ort_session import cpu_session


def _feeds(batch: list[list[int]]) -> dict[str, np.ndarray]:
    width = max(len(s) for s in batch)
    ids = np.zeros((len(batch), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def batch1_latencies_s(sess: ort.InferenceSession, inputs: list[list[int]]) -> list[float]:
    """One request at a time, no padding: the latency floor for a single call."""
    latencies = []
    for seq in inputs:
        started = time.perf_counter()
        sess.run(["sentence_embedding"], _feeds([seq]))
        latencies.append(time.perf_counter() - started)
    return latencies


def throughput(
    sessions: list[ort.InferenceSession], inputs: list[list[int]], batch_size: int, sort: bool
) -> float:
    """Sequences per second with one worker thread per session, batches of `batch_size`."""
    order = sorted(inputs, key=len) if sort else inputs
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    feeds = [_feeds(b) for b in batches]
    started = time.perf_counter()
    with ThreadPoolExecutor(len(sessions)) as pool:
        list(
            pool.map(
                lambda i: sessions[i % len(sessions)].run(["sentence_embedding"], feeds[i]),
                range(len(feeds)),
            )
        )
    return len(inputs) / (time.perf_counter() - started)


def best_inprocess(model: Path, inputs: list[list[int]]) -> tuple[str, float, dict[str, float]]:
    """Try the usual strategies; return the best one's name, its seq/s and every figure."""
    two_single = [cpu_session(model, 1), cpu_session(model, 1)]
    figures = {
        "batch 1, 2 sessions x 1 thread": throughput(two_single, inputs, 1, sort=False),
        "batch 8 sorted, 2 sessions x 1 thread": throughput(two_single, inputs, 8, sort=True),
        "batch 32 sorted, 2 sessions x 1 thread": throughput(two_single, inputs, 32, sort=True),
        "batch 32 unsorted, 2 sessions x 1 thread": throughput(two_single, inputs, 32, sort=False),
        "batch 1, 1 session x 2 threads": throughput(
            [cpu_session(model, 2)], inputs, 1, sort=False
        ),
    }
    name = max(figures, key=figures.__getitem__)
    return name, figures[name], figures
