"""Serve-time text tokenization with the `tokenizers` library (no transformers, no torch)."""

from __future__ import annotations

from pathlib import Path

from ferry.batcher.errors import InvalidInput
from ferry.batcher.request import TokenSequence
from tokenizers import Tokenizer


class TextTokenizer:
    def __init__(self, tokenizer_json: Path, max_length: int) -> None:
        self.max_length = max_length
        self._exact = Tokenizer.from_file(str(tokenizer_json))
        # Shipped tokenizer.json files often pin padding/truncation (all-MiniLM: fixed 128), which
        # would make every request cost 128 tokens: the batcher pads, per batch, instead.
        self._exact.no_padding()
        self._exact.no_truncation()
        self._truncating = Tokenizer.from_file(str(tokenizer_json))
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_length=max_length)

    def encode(self, texts: list[str], truncate: bool = False) -> list[TokenSequence]:
        for index, text in enumerate(texts):
            if not text.strip():
                raise InvalidInput(_field(index, len(texts)), "text must not be empty")
        encodings = (self._truncating if truncate else self._exact).encode_batch(texts)
        sequences = []
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_length:
                raise InvalidInput(
                    _field(index, len(texts)),
                    f"text is {len(encoding.ids)} tokens long; this model takes at most "
                    f"{self.max_length} (send truncate=true to cut it)",
                )
            sequences.append(TokenSequence.from_ids(encoding.ids, encoding.attention_mask))
        return sequences


def _field(index: int, count: int) -> str:
    return f"inputs[{index}]" if count > 1 else "inputs"
