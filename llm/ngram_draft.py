"""Draft tokens without a draft model: prompt lookup (n-gram) speculation.

When the text a request has so far (prompt and output) ends with an n-gram that occurred before,
the tokens that followed it there are a guess at what comes next: an answer that quotes or
edits its prompt (code, a passage to summarise) repeats long runs of it. This is llama-server's
`--spec-type ngram-simple` and onnxruntime-genai's n-gram speculation (Hugging Face's
`prompt_lookup_num_tokens`): the longest n-gram first (`max_n` down to `min_n`), its most recent
earlier occurrence. The batch lane (ortgenai_batch.py) verifies a draft in one forward pass.
"""

from __future__ import annotations


class NgramDraft:
    """One request's tokens, with the latest place each short n-gram of them ended at."""

    def __init__(self, tokens: list[int], max_n: int = 3, min_n: int = 1) -> None:
        assert 1 <= min_n <= max_n
        self._max_n, self._min_n = max_n, min_n
        self._tokens: list[int] = []
        # n-gram -> the index of its last token, at its latest occurrence that has a follower.
        self._ends: dict[tuple[int, ...], int] = {}
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        tokens = self._tokens
        tokens.append(token)
        end = len(tokens) - 2  # the n-grams ending just before `token` now have a follower
        for n in range(self._min_n, min(self._max_n, end + 1) + 1):
            self._ends[tuple(tokens[end - n + 1 : end + 1])] = end

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the longest n-gram the tokens end with; [] when
        none of them occurred before."""
        tokens = self._tokens
        if count <= 0:
            return []
        for n in range(min(self._max_n, len(tokens)), self._min_n - 1, -1):
            end = self._ends.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end + 1 : end + 1 + count]
        return []
