"""Serve-time text tokenization with the `tokenizers` library (no transformers, no torch).

Tokenizing runs off the event loop, in one worker thread, and per batch: texts that arrive while a
batch is being encoded wait and go together in the next `encode_batch` call (which releases the
GIL). One 4 MB text then costs its own request the time to tokenize it, not every other request
a stalled loop.

Texts come back as right-padded id and mask arrays with each row's length; checking those
lengths against the model is `encoder_validation.py`'s job, not this module's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer


class TextRejected(Exception):
    """A text the tokenizer cannot take; the caller names it (`index`) as its protocol does.
    `first`: a pair's first text (a query), named by the route's own field for it."""

    def __init__(self, index: int, message: str, first: bool = False) -> None:
        super().__init__(message)
        self.index = index
        self.message = message
        self.first = first


@dataclass(frozen=True)
class Tokenized:
    """Texts as right-padded [texts, longest] int64 ids and mask, and each row's length; pairs
    also with their segment ids (0 for the first text, 1 for the second)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    lengths: tuple[int, ...]
    token_type_ids: np.ndarray | None = None


@dataclass
class _Job:
    texts: list[str]
    truncate: bool
    future: asyncio.Future[Tokenized]
    pairs: list[str] | None = None


@dataclass
class _Outcome:
    tokenized: Tokenized | None = None
    error: TextRejected | None = None


class TextTokenizer:
    def __init__(self, tokenizer_json: Path, max_length: int) -> None:
        if not tokenizer_json.is_file():  # the library's own error names no file
            raise FileNotFoundError(f"tokenizer file not found: {tokenizer_json}")
        self.max_length = max_length
        self._exact = Tokenizer.from_file(str(tokenizer_json))
        # Shipped tokenizer.json files often pin padding/truncation (all-MiniLM: fixed 128), which
        # would make every request cost 128 tokens: the batcher pads, per batch, instead.
        self._exact.no_padding()
        self._exact.no_truncation()
        self._truncating = Tokenizer.from_file(str(tokenizer_json))
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_length=max_length)
        # What a pair's two texts may hold together, after its special tokens ([CLS], [SEP]s).
        self._pair_room = max_length - self._exact.num_special_tokens_to_add(True)
        self._executor: ThreadPoolExecutor | None = None
        self._waiting: list[_Job] = []
        self._draining = False
        self._drainer: asyncio.Task[None] | None = None

    def encode(
        self, texts: list[str], truncate: bool = False, pairs: list[str] | None = None
    ) -> Tokenized:
        """Tokenize in the calling thread; TextRejected says which text is at fault. With
        `pairs`, texts[i] and pairs[i] are one input (a cross-encoder's query and document)."""
        outcome = self._encode_one(_Job(texts, truncate, None, pairs))  # type: ignore[arg-type]  # no future: encoded here
        if outcome.error is not None:
            raise outcome.error
        assert outcome.tokenized is not None
        return outcome.tokenized

    async def encode_async(
        self, texts: list[str], truncate: bool = False, pairs: list[str] | None = None
    ) -> Tokenized:
        """`encode` in the tokenizer's worker thread, together with whatever else is waiting."""
        loop = asyncio.get_running_loop()
        job = _Job(texts, truncate, loop.create_future(), pairs)
        self._waiting.append(job)
        if not self._draining:
            self._draining = True
            self._drainer = loop.create_task(self._drain())
        return await job.future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        try:
            while self._waiting:
                jobs, self._waiting = self._waiting, []
                try:
                    outcomes: Sequence[_Outcome | Exception] = await loop.run_in_executor(
                        self._executor, self._encode_jobs, jobs
                    )
                except Exception as exc:  # a tokenizer bug must not hang its callers
                    outcomes = [exc] * len(jobs)
                for job, outcome in zip(jobs, outcomes, strict=True):
                    if job.future.done():
                        continue  # the caller left
                    if isinstance(outcome, Exception):
                        job.future.set_exception(outcome)
                    elif outcome.error is not None:
                        job.future.set_exception(outcome.error)
                    else:
                        assert outcome.tokenized is not None
                        job.future.set_result(outcome.tokenized)
        finally:
            self._draining = False

    def _encode_jobs(self, jobs: list[_Job]) -> list[_Outcome]:
        """Worker thread: every valid job's single texts in one `encode_batch` per truncation
        mode; pairs job by job (`_encode_pairs`)."""
        outcomes = [self._check(job) for job in jobs]
        for i, job in enumerate(jobs):
            if job.pairs is not None and not outcomes[i].error:
                outcomes[i] = self._encode_pairs(job)
        for truncate in (False, True):
            picked = [
                i
                for i, job in enumerate(jobs)
                if job.truncate is truncate and job.pairs is None and not outcomes[i].error
            ]
            inputs = [text for i in picked for text in jobs[i].texts]
            if not inputs:
                continue
            encodings = (self._truncating if truncate else self._exact).encode_batch(inputs)
            offset = 0
            for i in picked:
                count = len(jobs[i].texts)
                outcomes[i] = _padded(encodings[offset : offset + count])
                offset += count
        return outcomes

    def _encode_one(self, job: _Job) -> _Outcome:
        outcome = self._check(job)
        if outcome.error is not None:
            return outcome
        if job.pairs is not None:
            return self._encode_pairs(job)
        encodings = (self._truncating if job.truncate else self._exact).encode_batch(job.texts)
        return _padded(encodings)

    def _encode_pairs(self, job: _Job) -> _Outcome:
        """A cross-encoder's pairs, each distinct first text (a query sent with 256 documents)
        tokenized once, refused or cut once, then joined with each second text's tokens by the
        tokenizer's own post-processor (special tokens, segment ids, longest-first truncation):
        the ids `encode_batch` of the pairs gives, without tokenizing the query per pair."""
        assert job.pairs is not None
        firsts = list(dict.fromkeys(job.texts))  # distinct, in order
        alone = self._exact.encode_batch(firsts, add_special_tokens=False)
        encoded = dict(zip(firsts, alone, strict=True))
        for text, encoding in encoded.items():
            if len(encoding.ids) < self._pair_room:
                continue  # room for a second text's token at least
            if not job.truncate:
                index = job.texts.index(text)
                tokens, most = len(encoding.ids), self._pair_room - 1
                message = (
                    f"text is {tokens} tokens long; with its pair this model takes at most "
                    f"{most} (send truncate=true to cut it)"
                )
                return _Outcome(error=TextRejected(index, message, first=True))
            encoded[text] = self._cut(text, encoding)
        seconds = self._exact.encode_batch(list(job.pairs), add_special_tokens=False)
        joiner = self._truncating if job.truncate else self._exact
        pairs = zip(job.texts, seconds, strict=True)
        return _padded([joiner.post_process(encoded[f], s) for f, s in pairs], paired=True)

    def _cut(self, text: str, encoding: Encoding) -> Encoding:
        """A first text cut to the pair's room, once: longest-first truncation never keeps more
        of it, so the pairs come out as from the whole text. Re-encoded from its characters up
        to that token (not `Encoding.truncate`, whose overflow every pair would copy)."""
        end = encoding.offsets[self._pair_room - 1][1]
        return self._exact.encode(text[:end], add_special_tokens=False)

    def token_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """One text's ids, as the model sees them (no truncation), for /tokenize."""
        return self._exact.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._exact.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_strs(self, ids: list[int]) -> list[str]:
        return [self._exact.id_to_token(i) or "" for i in ids]

    @property
    def vocab_size(self) -> int:
        return self._exact.get_vocab_size()

    @staticmethod
    def _check(job: _Job) -> _Outcome:
        for index, text in enumerate(job.texts if job.pairs is None else job.texts + job.pairs):
            index %= len(job.texts)  # a pair's second text is named by its pair's index
            if not text.strip():
                return _Outcome(error=TextRejected(index, "text must not be empty"))
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    return _Outcome(
                        error=TextRejected(index, "text is not valid Unicode (lone surrogate)")
                    )
        return _Outcome()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def _padded(encodings: list[Encoding], paired: bool = False) -> _Outcome:
    lengths = tuple(len(encoding.ids) for encoding in encodings)
    input_ids = np.zeros((len(encodings), max(lengths, default=0)), dtype=np.int64)
    attention_mask = np.zeros_like(input_ids)
    token_type_ids = np.zeros_like(input_ids) if paired else None
    for row, (encoding, length) in enumerate(zip(encodings, lengths, strict=True)):
        input_ids[row, :length] = encoding.ids
        attention_mask[row, :length] = encoding.attention_mask
        if token_type_ids is not None:
            token_type_ids[row, :length] = encoding.type_ids
    return _Outcome(Tokenized(input_ids, attention_mask, lengths, token_type_ids))
