"""Logits only at the positions read (llm/logits_positions.py): the same numbers as the
builder's graph computing every position, on the real SmolLM2-135M int4 and the tiny model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ferry.llm import logits_positions, onnx_subset
from ferry.llm.ortgenai_kv import KVModel
from tests.llm.llm_paths import ONNX_DIR, REAL_MODEL

pytestmark = pytest.mark.unit


@pytest.fixture(params=[REAL_MODEL, ONNX_DIR], ids=["smollm2-int4", "tiny-fp32"])
def models(request, monkeypatch) -> tuple[KVModel, KVModel]:
    """The model with its head rewritten, and as the builder wrote it."""
    rewritten = KVModel(request.param, 1)
    monkeypatch.setattr(logits_positions, "rewrite", lambda *_: None)
    return rewritten, KVModel(request.param, 1)


def test_the_builders_heads_are_rewritten(models):
    rewritten, whole = models
    inputs = {i.name for i in rewritten._session.get_inputs()}
    assert logits_positions.POSITIONS in inputs
    assert logits_positions.POSITIONS not in {i.name for i in whole._session.get_inputs()}


def test_prompt_pieces_and_decode_steps_give_the_whole_graphs_logits_bit_for_bit(models):
    """A piece's last logits come from a head of two rows: one would round otherwise."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, models[0]._vocab, n).tolist() for n in (5, 9, 23)]
    blocks = [m.new_block(len(prompts), 64) for m in models]
    firsts = []
    for model, block in zip(models, blocks, strict=True):
        firsts.append([model.prefill(block, r, 0, p) for r, p in enumerate(prompts)])
    for ours, theirs in zip(*firsts, strict=True):
        assert np.array_equal(ours, theirs)
    lengths = np.array([len(p) for p in prompts])
    tokens = np.array([int(f.argmax()) for f in firsts[0]])
    steps = [
        m.decode(b, len(prompts), lengths, tokens) for m, b in zip(models, blocks, strict=True)
    ]
    assert np.array_equal(*steps)
    # Every position, where a caller reads them all (echo, speculation's checks).
    every = [m.prefill_every(b, 0, 0, prompts[0]) for m, b in zip(models, blocks, strict=True)]
    assert every[0].shape == (len(prompts[0]), every[0].shape[-1])
    assert np.array_equal(*every)


def _graph(tmp_path: Path, head_then: str) -> Path:
    """hidden [b, s, 4] -> MatMul by a weight -> `head_then` -> logits."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], [0.1] * 12)
    nodes = [helper.make_node("MatMul", ["hidden", "w"], ["scores"])]
    nodes.append(helper.make_node(head_then, ["scores"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["b", "s", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 3])],
        [weight],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_a_head_read_through_elementwise_ops_only_is_rewritten(tmp_path):
    assert logits_positions.rewrite(_graph(tmp_path, "Tanh"), "logits") is not None


def test_any_other_head_is_left_as_it_is(tmp_path):
    """A Softmax mixes positions' values over the vocabulary only, but it is not in the list of
    what is known to commute: the graph runs whole (a missed saving, never a wrong answer)."""
    assert logits_positions.rewrite(_graph(tmp_path, "Softmax"), "logits") is None
    assert logits_positions.rewrite(_graph(tmp_path, "Tanh"), "scores") is not None
    assert logits_positions.rewrite(_graph(tmp_path, "Tanh"), "hidden") is None


def test_the_rewrite_needs_no_onnx_package(monkeypatch):
    """A runtime install (the Docker image's lock) has no `onnx`: protobuf alone does it."""
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` would raise ImportError
    model = KVModel(ONNX_DIR, 1)
    assert logits_positions.POSITIONS in {i.name for i in model._session.get_inputs()}
    assert model.prefill(model.new_block(1, 8), 0, 0, [3, 4, 5]).ndim == 1


@pytest.mark.parametrize("model_dir", [REAL_MODEL, ONNX_DIR], ids=["smollm2-int4", "tiny-fp32"])
def test_the_subsets_messages_write_back_every_field_they_do_not_name(model_dir):
    """Parsed and serialized by onnx_subset, the builder's graph is the same model to `onnx`."""
    raw = (model_dir / "model.onnx").read_bytes()
    model = onnx_subset.ModelProto()
    model.ParseFromString(raw)
    assert onnx.load_from_string(model.SerializeToString()) == onnx.load_from_string(raw)
