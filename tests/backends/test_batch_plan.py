"""backends/batch_plan.py and onnx_graph_ops.py on graphs built in code: which axes pad, which
bucket, and which graphs run one request at a time, each for its reason."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ferry.backends.batch_plan import BatchPlan, plan_batching
from ferry.backends.onnx_graph_ops import read_graph_ops
from ferry.backends.tensor_signature import read_signature
from tests.support import batching_corpus, plain_graphs

pytestmark = pytest.mark.unit


def plan(path: Path, **settings) -> BatchPlan:
    signature = read_signature(ort.InferenceSession(str(path)))
    return plan_batching(signature, read_graph_ops(path), **settings)


def rules(batch_plan: BatchPlan) -> dict[str, str]:
    return {f"{r.tensor}[{r.axis}]": r.rule for r in batch_plan.axes}


def test_an_axis_a_mask_input_shares_is_padded(tmp_path):
    masked = plan(plain_graphs.masked_mean(tmp_path / "m.onnx"))
    assert masked.batched and masked.padded == {"T"}
    assert rules(masked) == {
        "data[0]": "batch",
        "data[1]": "pad",
        "mask[0]": "batch",
        "mask[1]": "pad",
    }


def test_without_a_mask_equal_sizes_only_unless_declared_or_named_as_a_mask(tmp_path):
    path = plain_graphs.masked_mean(tmp_path / "m.onnx")
    assert plan(path, mask_inputs=()).padded == frozenset()
    assert plan(path, mask_inputs=("data",)).padded == {"T"}
    assert plan(path, pad_axes=()).padded == frozenset()
    audio = batching_corpus.pooled_audio(tmp_path / "audio.onnx")
    assert plan(audio).padded == frozenset()
    assert plan(audio, pad_axes=("time",)).padded == {"time"}  # the user's word for it


def test_an_output_axis_no_input_axis_ties_turns_padding_off(tmp_path):
    nodes = [helper.make_node("Mul", ["data", "mask"], ["out"])]
    graph = helper.make_graph(
        nodes,
        "untied",
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", "T"]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", "T"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "out_len"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "untied.onnx")
    result = plan(tmp_path / "untied.onnx")
    assert result.padded == frozenset()
    assert "output 'out' axis 1 (out_len) could not be cut back" in result.axes[1].why


@pytest.mark.parametrize(
    ("graph", "words"),
    [
        ("gru_seq_first", "names axis 1 ('batch') as its batch"),
        ("int8_mlp", "DynamicQuantizeLinear"),
    ],
)
def test_graphs_whose_rows_mix_run_one_request_at_a_time(tmp_path, graph, words):
    path = batching_corpus.CORPUS[graph][0](tmp_path / f"{graph}.onnx")
    result = plan(path)
    assert not result.batched and words in result.why_alone
    assert set(rules(result).values()) == {"whole"}


def test_a_declared_batch_axis_batches_along_it_with_each_outputs_rows_found_by_name(tmp_path):
    path = batching_corpus.gru_seq_first(tmp_path / "gru.onnx")  # x [time, batch, 8]
    result = plan(path, batch_axis=1)
    assert result.batched and result.rows_axes == {"x": 1, "y": 2}  # y [time, 1, batch, 6]
    assert rules(result) == {"x[1]": "batch", "x[0]": "bucket"}
    assert result.rows_signature is not None
    assert result.rows_signature.input("x").shape == ("batch", "time", 8)
    assert "has no dynamic axis there" in plan(path, batch_axis=2).why_alone


def test_neighbour_dependence_accepted_by_name_batches(tmp_path):
    path = batching_corpus.int8_mlp(tmp_path / "int8.onnx")
    assert plan(path, accept_neighbour_dependence=True).batched


@pytest.mark.parametrize(
    ("axes", "mixes"),
    [([1], False), ([0], True), ([0, 1], True), (None, True)],
)
def test_a_reduction_over_the_rows_is_found_by_its_axes(tmp_path, axes, mixes):
    # opset 18: axes as an input (a Constant node's output), or none: every axis.
    nodes = [helper.make_node("ReduceMean", ["x", "axes"] if axes else ["x"], ["y"], keepdims=1)]
    if axes:
        constant = helper.make_tensor("a", TensorProto.INT64, [len(axes)], axes)
        nodes.insert(0, helper.make_node("Constant", [], ["axes"], value=constant))
    graph = helper.make_graph(
        nodes,
        "reduce",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "reduce.onnx")
    ops = read_graph_ops(tmp_path / "reduce.onnx")
    signature = read_signature(ort.InferenceSession(str(tmp_path / "reduce.onnx")))
    assert plan_batching(signature, ops).batched is not mixes


def test_an_image_inputs_height_and_width_are_never_padded(tmp_path):
    path = batching_corpus.segmentation(tmp_path / "seg.onnx")
    result = plan(path, mask_inputs=("image",), unpaddable=("height", "width"))
    assert result.padded == frozenset()
