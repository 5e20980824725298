"""Serve-time text tokenization with the `tokenizers` library (no transformers, no torch).

Tokenizing runs off the event loop, in one worker thread, and per batch: texts that arrive while a
batch is being encoded wait and go together in the next `encode_batch` call (which releases the
GIL). One 4 MB text then costs its own request the time to tokenize it, not every other request
a stalled loop.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from ferry.batcher.errors import InvalidInput
from ferry.batcher.request import TokenSequence


@dataclass
class _Job:
    texts: list[str]
    truncate: bool
    future: asyncio.Future[list[TokenSequence]]


@dataclass
class _Outcome:
    sequences: list[TokenSequence] = field(default_factory=list)
    error: InvalidInput | None = None


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

    def encode(self, texts: list[str], truncate: bool = False) -> list[TokenSequence]:
        """Tokenize in the calling thread; InvalidInput names the text at fault."""
        outcome = self._encode_one(texts, truncate)
        if outcome.error is not None:
            raise outcome.error
        return outcome.sequences

    async def encode_async(self, texts: list[str], truncate: bool = False) -> list[TokenSequence]:
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
                        job.future.set_result(outcome.sequences)
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
                outcomes[i] = self._sequences(encodings[offset : offset + count])
                offset += count
        return outcomes

    def _encode_one(self, texts: list[str], truncate: bool) -> _Outcome:
        outcome = self._check(texts)
        if outcome.error is not None:
            return outcome
        encodings = (self._truncating if truncate else self._exact).encode_batch(texts)
        return self._sequences(encodings)

    @staticmethod
    def _check(texts: list[str]) -> _Outcome:
        for index, text in enumerate(texts):
            if not text.strip():
                return _Outcome(
                    error=InvalidInput(_field(index, len(texts)), "text must not be empty")
                )
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    return _Outcome(
                        error=InvalidInput(
                            _field(index, len(texts)), "text is not valid Unicode (lone surrogate)"
                        )
                    )
        return _Outcome()

    def _sequences(self, encodings: list) -> _Outcome:
        sequences = []
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_length:
                return _Outcome(
                    error=InvalidInput(
                        _field(index, len(encodings)),
                        f"text is {len(encoding.ids)} tokens long; this model takes at most "
                        f"{self.max_length} (send truncate=true to cut it)",
                    )
                )
            sequences.append(TokenSequence.from_ids(encoding.ids, encoding.attention_mask))
        return _Outcome(sequences)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def _field(index: int, count: int) -> str:
    return f"inputs[{index}]" if count > 1 else "inputs"
