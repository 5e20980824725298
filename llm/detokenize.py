"""Generated ids to text as they come, written as the whole ids decode (vLLM's detokenizer does
the same with `tokenizers`' DecodeStream).

onnxruntime-genai's own token stream drops bytes that are not UTF-8 and the text after them:
"following", a lone lead byte, "  x" came out as "followingx", not "following�  x".
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class TextStream:
    """One generation's text; a piece is held back while it ends inside a character."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token: int) -> str:
        return self._stream.step(self._tokenizer, token) or ""
