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

pytestmark = pytest.mark.unit

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


QUERY = "when does the ferry leave the harbour for the island " * 4  # over 16 tokens
DOCUMENTS = ["at noon", "the first boat leaves at seven and the last at nine", "never"]


@pytest.mark.parametrize("query", ["a short query", QUERY])
def test_truncated_pairs_are_what_the_tokenizer_makes_of_each_whole_pair(tokenizer, query):
    """The query is cut once, before pairing: the ids are still those of each pair truncated
    whole (longest first), as `encode_batch` of the pairs gives them."""
    truncating = Tokenizer.from_file(str(TOKENIZER_JSON))
    truncating.no_padding()
    truncating.enable_truncation(max_length=16)
    tokenized = tokenizer.encode([query] * 3, truncate=True, pairs=DOCUMENTS)
    for row, document in enumerate(DOCUMENTS):
        want = truncating.encode(query, document)
        length = tokenized.lengths[row]
        assert tokenized.input_ids[row, :length].tolist() == want.ids
        assert tokenized.token_type_ids[row, :length].tolist() == want.type_ids


class CountingTokenizer(TextTokenizer):
    """Counts the characters handed to the `tokenizers` library, by either of its tokenizers."""

    def __init__(self) -> None:
        super().__init__(TOKENIZER_JSON, max_length=16)
        self.characters = 0
        self._exact, self._truncating = self._spy(self._exact), self._spy(self._truncating)

    def _spy(self, tokenizer: Tokenizer):
        counting = self

        class Spy:
            def __getattr__(self, name):
                return getattr(tokenizer, name)

            def encode_batch(self, inputs, add_special_tokens=True):
                texts = [t for item in inputs for t in ((item,) if isinstance(item, str) else item)]
                counting.characters += sum(len(text) for text in texts)
                return tokenizer.encode_batch(inputs, add_special_tokens=add_special_tokens)

            def encode(self, text, add_special_tokens=True):
                counting.characters += len(text)
                return tokenizer.encode(text, add_special_tokens=add_special_tokens)

        return Spy()


@pytest.mark.parametrize("truncate", [False, True])
def test_one_query_over_many_documents_is_tokenized_once(truncate):
    """Issue 48: a 100k-character query over 256 documents was tokenized 256 times."""
    counting = CountingTokenizer()
    query = "ferry " * 1000
    documents = [f"document {i}" for i in range(64)]
    try:
        counting.encode([query] * 64, truncate=truncate, pairs=documents)
    except TextRejected as exc:
        assert not truncate and exc.first and "truncate=true" in exc.message
        # Refused on the query alone: no document was tokenized.
        assert counting.characters == len(query)
    else:
        assert truncate
        # The query once, and its cut (16 tokens' worth) once; each document once.
        assert counting.characters < 2 * len(query) + sum(len(d) for d in documents)
    finally:
        counting.close()
