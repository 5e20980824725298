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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


class TextRejected(Exception):
    """A text the tokenizer cannot take; the caller names it (`index`) as its protocol does."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


@dataclass(frozen=True)
class Tokenized:
    """Texts as right-padded [texts, longest] int64 ids and mask, and each row's length."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    lengths: tuple[int, ...]


@dataclass
class _Job:
    texts: list[str]
    truncate: bool
    future: asyncio.Future[Tokenized]


@dataclass
class _Outcome:
    tokenized: Tokenized | None = None
    error: TextRejected | None = None


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
        self._executor: ThreadPoolExecutor | None = None
        self._waiting: list[_Job] = []
        self._draining = False
        self._drainer: asyncio.Task | None = None

    def encode(self, texts: list[str], truncate: bool = False) -> Tokenized:
        """Tokenize in the calling thread; TextRejected says which text is at fault."""
        outcome = self._encode_one(texts, truncate)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.tokenized is not None
        return outcome.tokenized

    async def encode_async(self, texts: list[str], truncate: bool = False) -> Tokenized:
        """`encode` in the tokenizer's worker thread, together with whatever else is waiting."""
        loop = asyncio.get_running_loop()
        job = _Job(texts, truncate, loop.create_future())
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
                    outcomes = await loop.run_in_executor(self._executor, self._encode_jobs, jobs)
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
                        job.future.set_result(outcome.tokenized)
        finally:
            self._draining = False

    def _encode_jobs(self, jobs: list[_Job]) -> list[_Outcome]:
        """Worker thread: every valid job's texts in one `encode_batch` per truncation mode."""
        outcomes = [self._check(job.texts) for job in jobs]
        for truncate in (False, True):
            picked = [
                i
                for i, job in enumerate(jobs)
                if job.truncate is truncate and not outcomes[i].error
            ]
            texts = [text for i in picked for text in jobs[i].texts]
            if not texts:
                continue
            encodings = (self._truncating if truncate else self._exact).encode_batch(texts)
            offset = 0
            for i in picked:
                count = len(jobs[i].texts)
                outcomes[i] = _padded(encodings[offset : offset + count])
                offset += count
        return outcomes

    def _encode_one(self, texts: list[str], truncate: bool) -> _Outcome:
        outcome = self._check(texts)
        if outcome.error is not None:
            return outcome
        encodings = (self._truncating if truncate else self._exact).encode_batch(texts)
        return _padded(encodings)

    @staticmethod
    def _check(texts: list[str]) -> _Outcome:
        for index, text in enumerate(texts):
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


def _padded(encodings: list) -> _Outcome:
    lengths = tuple(len(encoding.ids) for encoding in encodings)
    input_ids = np.zeros((len(encodings), max(lengths, default=0)), dtype=np.int64)
    attention_mask = np.zeros_like(input_ids)
    for row, (encoding, length) in enumerate(zip(encodings, lengths, strict=True)):
        input_ids[row, :length] = encoding.ids
        attention_mask[row, :length] = encoding.attention_mask
    return _Outcome(Tokenized(input_ids, attention_mask, lengths))
