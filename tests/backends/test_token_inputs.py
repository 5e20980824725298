"""TokenFeed (backends/token_inputs.py): a token model's feed read from its graph's inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from ferry.backends.token_inputs import TokenFeed, UnservableInputs
from ferry.batcher import TokenSequence, pad_batch

pytestmark = pytest.mark.unit

BATCH = [
    TokenSequence(np.array([101, 7, 102, 8, 102]), np.ones(5, np.int64), np.array([0, 0, 0, 1, 1])),
    TokenSequence.from_ids([101, 9, 102]),
]


@dataclass(frozen=True)
class Node:
    """onnxruntime's NodeArg, as far as the feed reads it."""

    name: str
    type: str = "tensor(int64)"
    shape: tuple = ("batch", "sequence")


def test_the_usual_bert_export_is_fed_ids_mask_and_zero_padded_segment_ids():
    feed = TokenFeed.from_graph([Node("input_ids"), Node("attention_mask"), Node("token_type_ids")])
    feeds = feed.feeds(pad_batch(BATCH))
    assert feed.takes_token_types and feed.sequence_axis == "sequence"
    assert feeds["token_type_ids"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    assert feeds["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


def test_names_and_dtypes_are_the_graphs():
    nodes = [
        Node("segment_ids", "tensor(int32)"),
        Node("input_word_ids:0", "tensor(int32)"),
        Node("input_mask", "tensor(float)"),
    ]
    feeds = TokenFeed.from_graph(nodes).feeds(pad_batch(BATCH))
    assert list(feeds) == ["segment_ids", "input_word_ids:0", "input_mask"]
    assert [v.dtype for v in feeds.values()] == [np.int32, np.int32, np.float32]
    assert feeds["input_word_ids:0"].tolist() == [[101, 7, 102, 8, 102], [101, 9, 102, 0, 0]]


def test_segment_ids_nobody_sent_are_zeros_and_a_graph_without_them_gets_none():
    plain = pad_batch([TokenSequence.from_ids([101, 102])])
    three = TokenFeed.from_graph(
        [Node("input_ids"), Node("attention_mask"), Node("token_type_ids")]
    )
    assert three.feeds(plain)["token_type_ids"].tolist() == [[0, 0]]
    ids_only = TokenFeed.from_graph([Node("input_ids")])
    assert (
        list(ids_only.feeds(pad_batch(BATCH))) == ["input_ids"] and not ids_only.takes_token_types
    )


@pytest.mark.parametrize(
    ("nodes", "named"),
    [
        ([Node("input_ids"), Node("pixel_values", "tensor(float)")], "'pixel_values'"),
        ([Node("attention_mask")], "no input is token ids"),
        ([Node("input_ids", "tensor(float)")], "'input_ids' is tensor(float)"),
        ([Node("input_ids"), Node("ids")], "'ids'"),
        ([Node("input_ids", shape=("batch",))], "'input_ids' has shape"),
    ],
)
def test_a_graph_that_is_no_token_model_is_refused_naming_the_input(nodes, named):
    with pytest.raises(UnservableInputs, match=r"model\.onnx") as info:
        TokenFeed.from_graph(nodes, "model.onnx")
    assert named in str(info.value)
