"""TextTokenizer (server/tokenization.py) on the default model's real tokenizer.json: padded
arrays with each row's length, no padding pinned by the file, truncation on request, refusals
that say which text, and concurrent callers batched without one failing another."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tokenizers import Tokenizer

from ferry.bench.server_process import DEFAULT_MODEL_DIR
from ferry.server.tokenization import TextRejected, TextTokenizer

TOKENIZER_JSON = DEFAULT_MODEL_DIR / "tokenizer.json"
TEXTS = ["a short one", "a somewhat longer sentence with more words in it"]


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = TextTokenizer(TOKENIZER_JSON, max_length=16)
    yield tokenizer
    tokenizer.close()


@pytest.fixture(scope="module")
def reference():
    reference = Tokenizer.from_file(str(TOKENIZER_JSON))
    reference.no_padding()
    reference.no_truncation()
    return reference


def test_texts_become_right_padded_arrays_with_their_lengths(tokenizer, reference):
    tokenized = tokenizer.encode(TEXTS)
    expected = [reference.encode(text).ids for text in TEXTS]
    assert tokenized.lengths == tuple(len(ids) for ids in expected)
    # Padded to this call's longest text, not to the 128 that all-MiniLM's file pins.
    assert tokenized.input_ids.shape == (2, max(tokenized.lengths))
    assert tokenized.input_ids.dtype == np.int64 and tokenized.attention_mask.dtype == np.int64
    for row, ids in enumerate(expected):
        assert tokenized.input_ids[row, : len(ids)].tolist() == ids
        assert tokenized.attention_mask[row].tolist() == [1] * len(ids) + [0] * (
            tokenized.input_ids.shape[1] - len(ids)
        )
        assert not tokenized.input_ids[row, len(ids) :].any()


def test_lengths_are_not_checked_here_and_truncate_cuts_to_the_limit(tokenizer):
    long = "word " * 40
    assert tokenizer.encode([long]).lengths[0] > 16  # the validator refuses it, not this
    cut = tokenizer.encode([long], truncate=True)
    assert cut.lengths == (16,) and cut.input_ids[0, -1] == 102  # still ends with [SEP]


@pytest.mark.parametrize(
    ("texts", "index", "message"),
    [
        (["ok", "   "], 1, "text must not be empty"),
        ([""], 0, "text must not be empty"),
        (["ok", "fine", "bad \ud800"], 2, "text is not valid Unicode (lone surrogate)"),
    ],
)
def test_a_text_it_cannot_take_is_refused_by_index(tokenizer, texts, index, message):
    with pytest.raises(TextRejected) as info:
        tokenizer.encode(texts)
    assert (info.value.index, info.value.message) == (index, message)


async def test_concurrent_callers_share_batches_and_one_refusal_fails_only_its_caller(
    tokenizer, reference
):
    calls = [
        tokenizer.encode_async([TEXTS[0]]),
        tokenizer.encode_async(["fine", " "]),
        tokenizer.encode_async([TEXTS[1]], truncate=True),
        tokenizer.encode_async(TEXTS),
    ]
    first, refused, cut, both = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(refused, TextRejected) and refused.index == 1
    assert first.input_ids[0].tolist() == reference.encode(TEXTS[0]).ids
    assert cut.lengths == (min(16, len(reference.encode(TEXTS[1]).ids)),)
    assert both.lengths == tokenizer.encode(TEXTS).lengths


def test_pairs_are_one_input_each_with_segment_ids(tokenizer, reference):
    tokenized = tokenizer.encode(["a query", "another"], pairs=["its document", "a second one"])
    for row, (first, second) in enumerate(
        [("a query", "its document"), ("another", "a second one")]
    ):
        want = reference.encode(first, second)
        length = tokenized.lengths[row]
        assert tokenized.input_ids[row, :length].tolist() == want.ids
        assert tokenized.token_type_ids[row, :length].tolist() == want.type_ids
        assert 1 in want.type_ids and not tokenized.token_type_ids[row, length:].any()
    assert tokenizer.encode(TEXTS).token_type_ids is None


def test_a_pair_with_an_empty_second_text_is_refused_by_its_index(tokenizer):
    with pytest.raises(TextRejected) as info:
        tokenizer.encode(["q", "q"], pairs=["fine", " "])
    assert info.value.index == 1


def test_a_missing_tokenizer_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer.json")):
        TextTokenizer(tmp_path / "tokenizer.json", max_length=16)
