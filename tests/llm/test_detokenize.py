"""Generated ids become the text their whole decode is, a piece at a time."""

from __future__ import annotations

import onnxruntime_genai as og
import pytest
from tokenizers import Tokenizer

from ferry.llm.detokenize import TextStream
from tests.llm.llm_paths import HF_DIR, ONNX_DIR

pytestmark = pytest.mark.unit

TOKENIZER = Tokenizer.from_file(str(HF_DIR / "tokenizer.json"))


def ids(*pieces: str | int) -> list[int]:
    out: list[int] = []
    for piece in pieces:
        out += [piece] if isinstance(piece, int) else TOKENIZER.encode(piece).ids
    return out


LEAD_BYTE = TOKENIZER.token_to_id("â")  # byte 0xE2: opens a three-byte character


@pytest.mark.parametrize(
    "generated",
    [
        ids("héllo wörld 東京"),
        ids("a", 1, "b", 2),  # special tokens are left out
        ids("following", LEAD_BYTE, "  x"),  # a byte that is not UTF-8, then more text
    ],
    ids=["characters", "specials", "broken-byte"],
)
def test_the_pieces_join_to_the_whole_decode(generated: list[int]) -> None:
    stream = TextStream(TOKENIZER)
    assert "".join(stream.step(token) for token in generated) == TOKENIZER.decode(generated)


def test_onnxruntime_genais_own_stream_loses_text_after_a_broken_byte() -> None:
    """Why Ferry does not use it: the case above, where it drops the spaces after the byte."""
    generated = ids("following", LEAD_BYTE, "  x")
    stream = og.Tokenizer(og.Model(str(ONNX_DIR))).create_stream()
    assert "".join(stream.decode(token) for token in generated) == "followingx"
    assert TOKENIZER.decode(generated) == "following\ufffd  x"


def test_special_tokens_are_kept_when_skip_special_tokens_is_off() -> None:
    generated = ids("a", 1, "b")
    stream = TextStream(TOKENIZER, skip_special_tokens=False)
    text = "".join(stream.step(token) for token in generated)
    assert text == TOKENIZER.decode(generated, skip_special_tokens=False)
    assert TOKENIZER.id_to_token(1) in text
