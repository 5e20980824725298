"""The boundary's messages: what goes in comes out, typed, errors as their own class."""

from __future__ import annotations

import numpy as np
import pytest

from ferry.backends.batch_plan import AxisRule, BatchPlan
from ferry.backends.tensor_signature import Signature, TensorSpec
from ferry.batcher import TensorRows, TokenSequence
from ferry.batcher.errors import InferenceFailed, QueueFull
from ferry.llm.base import GenerationDelta, Guidance, SamplingSettings, TokenLogprob
from ferry.llm.errors import PromptTooLong
from ferry.server.errors import InvalidInput
from ferry.server.procs import wire

pytestmark = pytest.mark.unit


def _crossed(rows: TensorRows, outputs=("y",)) -> tuple[wire.Submit, TensorRows]:
    """`rows` through the one Submit message and back, as the engine process reads it."""
    header, frames = wire.pack_request(5, "m", rows, 0.5, outputs, -3, {})
    (message,) = wire.to_engine.decode(wire.encoder.encode([header]))
    assert isinstance(message, wire.Submit) and wire.frame_count(message) == len(frames)
    return message, wire.unpack_request(message, [bytes(f) for f in frames])


def test_a_token_request_crosses_as_the_same_message_and_comes_back_equal():
    sequences = [
        TokenSequence.from_ids([101, 7, 102]),
        TokenSequence.from_ids([101, 102], [1, 0]),
    ]
    message, rows = _crossed(wire.sequence_rows(sequences), outputs=None)
    assert message.names == ("lengths", "input_ids", "attention_mask")  # no segment ids
    assert message.outputs is None and rows.rows == 2
    back = wire.row_sequences(rows)
    for sent, got in zip(sequences, back, strict=True):
        np.testing.assert_array_equal(got.input_ids, sent.input_ids)
        np.testing.assert_array_equal(got.attention_mask, sent.attention_mask)
        assert got.token_type_ids is None


def test_segment_ids_cross_with_zeros_for_a_row_without_them():
    pair = TokenSequence(
        np.array([101, 7, 102, 8, 102]), np.ones(5, np.int64), np.array([0, 0, 0, 1, 1])
    )
    sequences = [pair, TokenSequence.from_ids([101, 102])]
    _, rows = _crossed(wire.sequence_rows(sequences))
    back = wire.row_sequences(rows)
    np.testing.assert_array_equal(back[0].token_type_ids, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(back[1].token_type_ids, [0, 0])


def test_a_row_keeps_names_dtypes_and_shapes():
    row = {
        "sentence_embedding": np.arange(6, dtype=np.float32).reshape(2, 3)[0],
        "last_hidden_state": np.arange(12, dtype=np.float16).reshape(4, 3),
        "label": np.array(3, dtype=np.int64),
    }
    header, frames = wire.pack_row(9, 1, row)
    (message,) = wire.to_api.decode(wire.encoder.encode([header]))
    assert wire.frame_count(message) == len(frames) == 3
    assert isinstance(message, wire.Row) and (message.rid, message.index) == (9, 1)
    back = wire.unpack_row(message, [bytes(f) for f in frames])
    assert list(back) == list(row)
    for name, value in row.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)


def test_a_plain_graphs_rows_cross_whatever_their_dtype_strings_included():
    tensors = {
        "x": np.arange(12, dtype=np.float16).reshape(2, 2, 3),
        "flag": np.array([True, False]),
        "city": np.array([[b"Oslo"], [b""]], dtype=object),
        "name": np.array([["\u00e9"], ["b"]], dtype=object),  # str and bytes kept apart
        "none": np.zeros((2, 0), np.uint64),
        "scalar": np.array(7, np.int8),
    }
    rows = TensorRows(tensors, 2, {"T": 2}, (("x:2", 3),))
    trace = {
        "traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"
    }  # the request's, for the engine's spans
    header, frames = wire.pack_request(5, "g", rows, 0.5, ("y",), -3, trace)
    (message,) = wire.to_engine.decode(wire.encoder.encode([header]))
    assert isinstance(message, wire.Submit) and wire.frame_count(message) == len(tensors)
    assert (message.outputs, message.timeout_s, message.priority) == (("y",), 0.5, -3)
    assert message.trace == trace
    back = wire.unpack_request(message, [bytes(f) for f in frames])
    assert (back.rows, back.axis_sizes, back.shape_key) == (2, {"T": 2}, (("x:2", 3),))
    for name, value in tensors.items():
        assert back.tensors[name].dtype == value.dtype and back.tensors[name].shape == value.shape
        assert back.tensors[name].tolist() == value.tolist()


def test_a_plain_graphs_signature_reaches_the_api_processes():
    signature = Signature(
        (TensorSpec("X", "FP32", ("N", 30)),),
        (TensorSpec("p", "FP32", ("p:0", "p:1"), class_map=True, unnamed=frozenset({"p:1"})),),
    )
    rule = AxisRule("X", 0, "N", "batch", "rows of requests stack")
    plan = BatchPlan(True, frozenset({"T"}), (rule,))
    graph = wire.GraphInfo("gb", "onnxruntime", 2, signature, plan, ("p",), {"p": [0, 1]})
    (info,) = wire.to_api.decode(wire.encoder.encode([wire.Info(1, (), (), (graph,))]))
    assert isinstance(info, wire.Info) and info.graphs == (graph,)


def test_generation_requests_and_deltas_keep_every_field():
    sampling = SamplingSettings(
        max_tokens=7,
        temperature=0.5,
        seed=3,
        stop=("\n",),
        logprobs=2,
        guidance=Guidance("regex", "a+"),
        logit_bias=((5, -1.5),),
    )
    request = wire.Generate(4, 3, "m", "req-1", [1, 2, 3], sampling, "adapter", -10)
    assert wire.to_engine.decode(wire.encoder.encode([request])) == [request]
    delta = GenerationDelta(
        "hi", 2, "stop", (TokenLogprob(1, -0.1, ((2, -0.5),)),), (None,), cached_tokens=4
    )
    (got,) = wire.to_api.decode(wire.encoder.encode([wire.Delta(4, delta)]))
    assert isinstance(got, wire.Delta) and got.delta == delta


@pytest.mark.parametrize(
    "error",
    [
        QueueFull(2.5),
        InvalidInput("input_ids[1]", "sequence has 600 tokens"),
        PromptTooLong(900, 512, "messages"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_come_back_as_their_own_class_with_their_fields(error):
    back = wire.error_from_wire(wire.error_to_wire(error), RuntimeError)
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert vars(back) == vars(error)


def test_an_error_of_another_kind_comes_back_as_the_fallback_naming_it():
    back = wire.error_from_wire(wire.error_to_wire(KeyError("boom")), InferenceFailed)
    assert isinstance(back, InferenceFailed) and "KeyError" in str(back)
