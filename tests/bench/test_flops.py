"""The FLOPs-per-token estimate and the GEMM ceiling the LLM benchmark reports."""

from __future__ import annotations

import json

import pytest

from ferry.bench.flops import flops_per_token, flops_per_token_of, gemm_gflops
from tests.llm.llm_paths import HF_DIR

pytestmark = pytest.mark.unit

# SmolLM2-135M-Instruct's config.json (the default chat model).
SMOLLM2 = {
    "hidden_size": 576,
    "num_attention_heads": 9,
    "head_dim": 64,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "num_hidden_layers": 30,
}


def test_a_token_costs_two_flops_per_weight_it_multiplies():
    # 30 x (q, o: 576^2 each; k, v: 576 x 192 each; MLP 3 x 576 x 1536) + lm_head 576 x 49152
    # = 134.5M weights: the "2 x 135M parameters" of a 135M model with tied embeddings.
    weights = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) + 576 * 49152
    assert flops_per_token(SMOLLM2) == 2 * weights == pytest.approx(0.269e9, rel=1e-3)


def test_grouped_query_attention_costs_less_than_full_heads():
    full = {**SMOLLM2, "num_key_value_heads": 9}
    assert flops_per_token(full) - flops_per_token(SMOLLM2) == 2 * 30 * 2 * 576 * (576 - 192)


def test_read_from_a_model_folder(tmp_path):
    config = json.loads((HF_DIR / "config.json").read_text())
    assert flops_per_token_of(HF_DIR) == flops_per_token(config)
    assert flops_per_token_of(tmp_path) is None


def test_gemm_throughput_is_measured():
    # 64^3 x 2 FLOPs in any finite time: positive and finite; no timing threshold.
    assert 0 < gemm_gflops(size=64, seconds=0.01) < float("inf")
