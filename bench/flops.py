"""How much arithmetic an LLM's tokens cost, against what this machine's cores can do.

A decoder token costs about 2 FLOPs per weight it multiplies (one multiply, one add): the
attention and MLP projections of every layer plus the output projection onto the vocabulary
(attention over the context itself is left out: small at the bench's short contexts). The ceiling
is numpy's float32 GEMM on the same cores, measured, not a datasheet figure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np


def flops_per_token(hf_config: dict) -> float:
    """2 x the matmul weights a Llama-style decoder applies to one token."""
    hidden = hf_config["hidden_size"]
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hidden // heads
    kv = hf_config.get("num_key_value_heads", heads) * head_dim
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv  # q, o; k, v
    mlp = 3 * hidden * hf_config["intermediate_size"]  # gate, up, down
    output = hidden * hf_config["vocab_size"]
    return 2.0 * (hf_config["num_hidden_layers"] * (attention + mlp) + output)


def flops_per_token_of(hf_dir: Path) -> float | None:
    """From a Hugging Face folder's config.json; None when there is none."""
    path = hf_dir / "config.json"
    return flops_per_token(json.loads(path.read_text())) if path.exists() else None


def gemm_gflops(size: int = 1024, seconds: float = 1.0) -> float:
    """numpy float32 square GEMM throughput on this machine's cores (its BLAS threads), best of
    the repetitions that fit in `seconds`."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
    out = np.empty((size, size), dtype=np.float32)
    np.matmul(a, b, out=out)  # warm-up: BLAS threads and pages
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / best / 1e9
