"""A tiny real ONNX embedding model with two real faults, for the server's fault guarantees.

Not a mock: `ferry serve` loads it like any exported model and ONNX Runtime runs it. It embeds
a token as a row of a 100-row table and mean-pools over the mask, and
- a token id from 100 up (the manifest claims a vocabulary of 1000) makes ONNX Runtime's
  Gather fail, for that request and for any batch that holds it: a poisoned input;
- token SLOW keeps ONNX Runtime busy in a Loop for seconds: a backend that hangs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

TABLE_ROWS = 100
VOCAB = 1000  # what the manifest claims: ids 100..999 pass validation and fail in the model
SLOW = 99
WIDTH = 4
# Of a 64x64 matmul: ~4.5 s on a quiet core, ~9x the test's infer_timeout_s (100k took only
# 0.45 s on a quiet machine, under the timeout).
LOOP_ITERATIONS = 1_000_000


def table() -> np.ndarray:
    return np.arange(TABLE_ROWS * WIDTH, dtype=np.float32).reshape(TABLE_ROWS, WIDTH) / 100


def expected_embedding(ids: list[int]) -> list[float]:
    """What the model returns for `ids` run alone (mask all ones)."""
    return table()[ids].mean(axis=0).tolist()


def build(folder: Path, tokenizer_json: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    square = np.eye(64, dtype=np.float32)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["v_in", "square"], ["v_out"]),
        ],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [64, 64]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [64, 64]),
        ],
        [numpy_helper.from_array(square, "square")],
    )
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["embedded"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axis2"], ["mask_3d"]),
        helper.make_node("Mul", ["embedded", "mask_3d"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask_3d", "axis1"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["pooled"]),
        # Trip count: LOOP_ITERATIONS when any token is SLOW, else 0.
        helper.make_node("Equal", ["input_ids", "slow_token"], ["is_slow"]),
        helper.make_node("Cast", ["is_slow"], ["is_slow_i"], to=TensorProto.INT64),
        helper.make_node("ReduceMax", ["is_slow_i"], ["any_slow"], keepdims=0),
        helper.make_node("Mul", ["any_slow", "iterations"], ["trips"]),
        helper.make_node("Loop", ["trips", "true", "square"], ["spun"], body=body),
        helper.make_node("ReduceSum", ["spun"], ["spun_sum"], keepdims=0),
        helper.make_node("Mul", ["spun_sum", "zero"], ["nothing"]),
        helper.make_node("Add", ["pooled", "nothing"], ["sentence_embedding"]),
    ]
    initializers = [
        numpy_helper.from_array(table(), "table"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array(SLOW, dtype=np.int64), "slow_token"),
        numpy_helper.from_array(np.array(LOOP_ITERATIONS, dtype=np.int64), "iterations"),
        numpy_helper.from_array(np.array(True), "true"),
        numpy_helper.from_array(square, "square"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
    ]
    graph = helper.make_graph(
        nodes,
        "faulty",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", WIDTH])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, folder / "model.onnx")
    shutil.copy(tokenizer_json, folder / "tokenizer.json")
    from ferry.backends.manifest import ModelManifest

    ModelManifest(task="embedding", max_length=16, vocab_size=VOCAB, source="tests").write(folder)
    return folder
