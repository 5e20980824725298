"""Running requests decoded together: one forward pass per turn for all of them (ortgenai_kv.py).

One turn (`step`) gives every prompt still going in its next chunk (`prefill_chunk` tokens, one
request at a time: the attention kernel takes a piece after a past only at batch 1), then runs
ONE decode step for every request that has a token to feed. A new request therefore starts on the
next turn, up to `max_running`, while the others keep decoding; one that arrives while a turn's
prompts go in joins them (the owner admits arrivals at each first token), so a burst's prompts
go in back to back, not a decode step apart. A prompt's keys and values go in a
block of their own; once it is in, they are copied into the next free row of the shared decode
block, and the block is kept packed (a finished row takes the last row's place).

Prefix cache: every finished prompt's keys and values are parked in the PrefixCache
(ortgenai_prefix.py) at once, under the request's scope (its model and `cache_salt`), so
requests running together with one system prompt already share it; a hit copies the shared
part in and computes only the rest (at least TAIL tokens, as a prompt piece), whether the request
runs alone or joins rows already decoding; a prompt sent again whole runs nothing, its first
token chosen from the logits kept with the entry. A hit on all but the last token once went
straight to a decode row where others decoded (a burst's first tokens from one step), but that
token's keys and logits then rounded as a decode step's, not a prompt's, and greedy text depended
on what else ran: on bench.llm_peer's 8 prompts the same at 1, 4 and 8 streams for 4-6 of 8 with
the cache on, 8 of 8 without it; with the tail a piece, 8 of 8 both ways.

Echo: every prompt piece's forward gives every position's logits, so an `echo` request's
prompt is scored as it goes in (the entries an og.Generator gives, tested), and no second
og.Model is loaded for it; it reads nothing from the prefix cache (a hit would skip positions it
must score), and fills it as any other.

Grammars: a constrained request decodes in the same forward pass as the others; its row's
logits are masked to what its llguidance matcher allows before its token is chosen, and the token
is consumed after (grammar_rows.py, compiled on a thread pool while the prompt goes in).

Speculation (`spec_tokens` > 0, off by default): a request decoding alone drafts the tokens that
followed the latest earlier occurrence of its last few tokens (ngram_draft.py) and checks them in
one forward pass of its next token and the draft (`_verify`: the prompt path, batch 1), keeping
the longest prefix its own choice agrees with, and one token more. Sampled and constrained rows
speculate too: the choice is the decode step's own, in sequence. Several rows decode as before
(checking would take one pass per row). Numerics: the checking pass runs the prompt's kernels,
which round differently from a decode step's of one row or of two (below): on SmolLM2 int4 the
logits of one position differ by up to ~1 between the paths, so greedy text may part from the
text without speculation at a near tie (bench.llm_spec counts how often: 6 of 6 identical at
128 tokens; with one-token n-grams, 5 of 6). In the deterministic mode a lone request's decode
steps run two rows, whose rounding the checking pass does not share either (one text of two
parted at token 6), so the settings refuse speculation there; on the fp32 tiny model the
paths agree (tested).

Batch invariance (SmolLM2-135M int4): a decode step of two or more rows gives every row the same
logits whatever the other rows hold (tested), but onnxruntime's MatMulNBits runs other kernels
for a single row (M = 1), whose rounding differs. A request that decodes alone for part of its
life (one stream, or the tail of a burst) may so get another greedy text: on bench.llm_peer's 8
prompts, 64 tokens, the text was the same at 1, 4 and 8 streams for 2 of 8 by default, 8 of 8
with `deterministic`, which never steps fewer than two rows (a lone request is paired with an
idle scratch row) at the price of the one-stream decode (up to half as fast, docs/apis.md). Prompt
chunks are never one token for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ferry.llm.base import FinishReason, SamplingSettings
from ferry.llm.grammar_rows import GrammarCompiler, RowGrammar
from ferry.llm.logprobs import next_logprobs
from ferry.llm.ngram_draft import NgramDraft
from ferry.llm.ortgenai_kv import KVBlock, KVModel
from ferry.llm.ortgenai_prefix import ModelPrefixCache
from ferry.llm.sampling import Sampler, end_ids

_MIN_LENGTH = 256  # the decode block's smallest length; it doubles as rows grow
# Drafts come from n-grams of 3 down to 2 tokens: one token alone matched too often where the
# answer did not quote (bench.llm_spec: 1.29x with it, 2.14x without, on a loaded 2-core box;
# that run before the draft length adapted).
_MIN_NGRAM = 2


def needs_generator(adapter: str | None, sampling: SamplingSettings) -> bool:
    """Requests only an og.Generator serves (ortgenai_lora.GeneratorLane): an adapter is bound
    to a generator. A grammar is not (its row is masked here, grammar_rows.py), nor is `echo`
    (each prompt piece's forward gives every position's logits, scored as it goes in)."""
    del sampling  # every setting is served here; only the adapter decides
    return adapter is not None


class BatchLane:
    """Running requests on one KVModel, decoded as a batch. Lives and dies on the owner thread."""

    def __init__(
        self,
        model: KVModel,
        max_running: int,
        eos_ids: set[int],
        *,
        cache: ModelPrefixCache | None = None,
        prefill_chunk: int = 0,
        deterministic: bool = False,
        grammars: GrammarCompiler | None = None,
        spec_tokens: int = 0,
        before_forward: Callable[[], None] | None = None,
    ) -> None:
        self._model = model
        # Called right before each forward pass, its inputs bound (the owner loop's flush).
        self._before_forward = before_forward
        self.max_running = max_running
        self._eos_ids = eos_ids
        self.cache = cache
        self._chunk = prefill_chunk  # 0: a whole prompt in one piece; else at least 2
        self._min_rows = 2 if deterministic else 1
        self._spec_tokens = spec_tokens  # drafted tokens a verify step checks at most; 0: off
        self.jobs: list[Any] = []  # every job here, in admission order
        self._prefilling: list[Any] = []  # prompt still going in (own block)
        self._rows: list[Any] = []  # decoding; job i sits in row i of self._block
        self._block: KVBlock | None = None
        self._lengths = np.zeros(0, np.int64)  # tokens in each row's KV
        self._tokens = np.zeros(0, np.int64)  # the token each row feeds next
        # The owner loop shares one between its lanes; a lane made alone (tests) has its own.
        self.drafted = self.accepted = 0  # speculation's tokens drafted and accepted, all told
        self._own_grammars = grammars is None
        self._grammars = GrammarCompiler(model.model_dir) if grammars is None else grammars

    def begin(
        self, job: Any, adapter: str | None, prompt_ids: list[int], sampling: SamplingSettings
    ) -> None:
        """Give `job` its own prompt block, filled from the prefix cache where it can be."""
        assert adapter is None
        entry, reused = None, 0
        # `echo` scores every prompt position: none may come from the cache (it is filled after).
        if self.cache is not None and not sampling.echo:
            # A grammar's compile hides behind its prompt's pass: a constrained repeat keeps one.
            whole = sampling.guidance is None
            entry, reused = self.cache.lookup(job.add.cache_salt, prompt_ids, whole)
        job.sampler = Sampler(sampling, prompt_ids, end_ids(self._eos_ids, sampling))
        # Compiled on the pool while the prompt goes in; waited for at the first token.
        guidance = sampling.guidance
        job.grammar = None if guidance is None else self._grammars.compile(guidance)
        job.cached_tokens = reused
        job.tokens = list(prompt_ids[:reused])  # prompt tokens whose keys and values are in
        job.pending = list(prompt_ids[reused:])
        job.repeat_logits = None  # the logits a whole repeat's first token comes from
        job.prompt_logprobs = (None,) if sampling.echo else None  # the first token has none
        job.drafts = NgramDraft(prompt_ids, min_n=_MIN_NGRAM) if self._spec_tokens else None
        job.draft_length = self._spec_tokens
        self.jobs.append(job)
        if entry is not None and not job.pending:  # sent before whole (lookup: logits kept)
            job.repeat_logits = entry.logits
            job.generator = entry.kv  # read only: copied into its decode row at its first turn
        else:
            job.generator = self._model.new_block(1, len(prompt_ids))  # the "running" mark
            if entry is not None:
                job.generator.copy_row(entry.kv, 0, 0, reused)
        self._prefilling.append(job)

    def step(self) -> Iterator[tuple[Any, int | None, FinishReason | None, Exception | None]]:
        """(job, token or None, finish reason or None, error or None) for every request that
        produced a token or failed this turn; a turn spent on a prompt chunk yields nothing.
        A request begun while the turn runs (the owner admits arrivals at each first token) has
        its prompt go in this turn too, before the decode step."""
        fed: set[int] = set()
        while job := next((j for j in self._prefilling if id(j) not in fed), None):
            fed.add(id(job))
            try:
                logits = self._feed(job)
                if logits is None:
                    continue
                token = self._choose(job, logits)
            except Exception as exc:  # this request failed; the others go on
                yield job, None, None, exc
                continue
            self._join(job, token, logits)
            yield self._outcome(job, token)
        if len(self._rows) == 1 and (draft := self._draft(self._rows[0])):
            yield from self._verify(self._rows[0], draft)
        elif self._rows:
            yield from self._decode()

    def _feed(self, job: Any) -> np.ndarray | None:
        """The next chunk of `job`'s prompt; the last position's logits once it is all in."""
        if job.repeat_logits is not None:  # nothing to run (ortgenai_prefix.py)
            repeat: np.ndarray = job.repeat_logits
            return repeat
        count = self._chunk or len(job.pending)
        if len(job.pending) - count == 1:
            count -= 1  # leave two for the last piece: a piece of one runs other kernels
        piece, job.pending = job.pending[:count], job.pending[count:]
        done = len(job.tokens)
        sampling: SamplingSettings = job.add.sampling
        if sampling.echo:  # row i of the piece scores prompt token done + i + 1
            every = self._model.prefill_every(
                job.generator, 0, done, piece, before_run=self._before_forward
            )
            scored = job.add.prompt_ids[done + 1 : done + 1 + len(piece)]
            job.prompt_logprobs += next_logprobs(every, scored, sampling.logprobs or 0)
            logits = every[-1]
        else:
            logits = self._model.prefill(
                job.generator, 0, done, piece, before_run=self._before_forward
            )
        job.tokens += piece
        return None if job.pending else logits

    def _join(self, job: Any, token: int, logits: np.ndarray) -> None:
        """A prompt is in: park its keys, values and last logits (unless they came from the
        cache whole), move them to the next decode row."""
        self._prefilling.remove(job)
        prompt: KVBlock = job.generator
        if self.cache is not None and job.repeat_logits is None:
            kept = logits.copy()  # one row of its own, not a view of the forward's output
            kept.flags.writeable = False  # every repeat of the prompt reads it
            self.cache.put(job.add.cache_salt, list(job.tokens), prompt, kept)
        self._add_row(job, prompt, len(job.tokens), token)

    def _add_row(self, job: Any, source: KVBlock, computed: int, token: int) -> None:
        """`job` takes the next decode row: the first `computed` positions of `source`'s row 0,
        `token` its next input."""
        row = len(self._rows)
        self._reserve(row + 1, computed + 1)
        assert self._block is not None
        self._block.copy_row(source, 0, row, computed)
        self._rows.append(job)
        self._lengths[row] = computed
        self._tokens[row] = token
        job.generator = self._block

    def _decode(self) -> list[tuple[Any, int | None, FinishReason | None, Exception | None]]:
        rows = len(self._rows)
        self._reserve(rows, int(self._lengths[:rows].max()) + 1)
        assert self._block is not None
        run = max(rows, self._min_rows)
        try:
            lengths, tokens = self._lengths[:run], self._tokens[:run]
            logits = self._model.decode(
                self._block, run, lengths, tokens, before_run=self._before_forward
            )
        except Exception as exc:  # the step failed for all of them
            return [(job, None, None, exc) for job in self._rows]
        self._lengths[:rows] += 1
        results: list[tuple[Any, int | None, FinishReason | None, Exception | None]] = []
        for row, job in enumerate(list(self._rows)):
            try:
                token = self._choose(job, logits[row])
            except Exception as exc:  # its grammar failed: this request only
                results.append((job, None, None, exc))
                continue
            self._tokens[row] = token
            results.append(self._outcome(job, token))
        return results  # after every row's choice: finishing ones repack the block

    def _draft(self, job: Any) -> list[int]:
        """Tokens that may follow `job`'s next one (ngram_draft.py); [] when speculation is off
        or nothing fits. Only a lone decoding row speculates: the attention kernel takes several
        tokens after a past only at batch 1, so rows would verify one forward pass each."""
        if job.drafts is None:
            return []
        # The verify step emits up to len(draft) + 1 tokens: no more than the request may have.
        room = job.sampler.sampling.max_tokens - job.generated - 1
        drafted: list[int] = job.drafts.propose(min(job.draft_length, room))
        return drafted

    def _verify(
        self, job: Any, draft: list[int]
    ) -> Iterator[tuple[Any, int | None, FinishReason | None, Exception | None]]:
        """One forward pass over the row's next token and `draft` (row 0, alone): the tokens
        chosen from its positions, in order, while each agrees with the draft, and the one
        after the last agreeing. The choice is the decode step's own (`_choose`: sampler,
        penalty, grammar mask, in sequence), so the tokens are those one step at a time would
        give, sampled ones too: sampling p and keeping the draft only where the sample equals
        it is the rejection rule for a one-token draft. Keys and values past the last accepted
        token are left behind the row's length, where the next step writes over them."""
        start = int(self._lengths[0])
        ids = [int(self._tokens[0]), *draft]
        self._reserve(1, start + len(ids))
        assert self._block is not None
        chosen: list[tuple[int, Any]] = []
        try:
            logits = self._model.prefill_every(
                self._block, 0, start, ids, keep=True, before_run=self._before_forward
            )
            for position, row in enumerate(logits):
                token = self._choose(job, row)
                chosen.append((token, job.logprob))
                if position == len(draft) or token != draft[position] or token in job.sampler.ends:
                    break
        except Exception as exc:  # the forward or its grammar failed: this request only
            yield job, None, None, exc
            return
        self._lengths[0] = start + len(chosen)
        self._tokens[0] = chosen[-1][0]
        self.accepted += len(chosen) - 1
        self.drafted += len(draft)
        # Hugging Face's heuristic schedule: a draft taken whole earns two more tokens next
        # time, one cut short costs one (a rejected draft's pass costs more than a decode step).
        whole = len(chosen) > len(draft)
        job.draft_length = max(1, min(self._spec_tokens, job.draft_length + (2 if whole else -1)))
        for token, logprob in chosen:
            job.logprob = logprob
            outcome = self._outcome(job, token)
            yield outcome  # the owner counts it, and may finish the request (a stop string)
            if outcome[2] is not None or job.generator is None:
                return

    def _choose(self, job: Any, logits: np.ndarray) -> int:
        """`job`'s next token (its log probability noted on it), within its grammar if any."""
        sampler: Sampler = job.sampler
        if job.grammar is None:
            token, job.logprob = sampler.choose(logits)
        else:
            grammar: RowGrammar = job.grammar.result()  # raises the compile's error
            token, job.logprob = sampler.choose(logits, grammar.allowed(logits.shape[-1]))
            if token not in sampler.ends:  # the end needs no commit: the request is over
                grammar.consume(token)
        if job.drafts is not None:
            job.drafts.append(token)
        return token

    def _outcome(
        self, job: Any, token: int
    ) -> tuple[Any, int | None, FinishReason | None, Exception | None]:
        if token in job.sampler.ends:  # not counted or emitted, as OpenAI servers do
            return job, None, "stop", None
        if job.generated + 1 >= job.sampler.sampling.max_tokens:
            return job, token, "length", None
        return job, token, None, None

    def _reserve(self, rows: int, length: int) -> None:
        """Make or grow the decode block to hold `rows` rows of `length` tokens. It has a row
        for every request that may run from the start: requests of a burst join a row at a
        time, and each growth copied every row into fresh memory while all of them waited (8
        streams: ~6-8 % of the owner's time). Its pages are mapped as first written, so rows
        not in use cost no memory (KVModel.new_block). Its length doubles."""
        rows = max(rows, self._min_rows)
        block = self._block
        if block is not None and block.rows >= rows and block.length >= length:
            return
        new_rows = max(rows, self.max_running)
        new_length = _MIN_LENGTH if block is None else block.length
        while new_length < length:
            new_length *= 2
        grown = self._model.new_block(new_rows, new_length, mapped=True)
        for row in range(len(self._rows)):  # rows exist only once a block does
            grown.copy_row(block, row, row, int(self._lengths[row]))  # type: ignore[arg-type]  # not None here
        lengths, tokens = np.zeros(new_rows, np.int64), np.zeros(new_rows, np.int64)
        lengths[: self._lengths.size] = self._lengths
        tokens[: self._tokens.size] = self._tokens
        self._block, self._lengths, self._tokens = grown, lengths, tokens
        for job in self._rows:
            job.generator = grown
        self._model.forget_bindings()

    def remove(self, job: Any) -> None:
        """Take `job` off the lane (its prompt's keys and values are already in the cache)."""
        if job.generator is None:
            return
        self.jobs.remove(job)
        job.generator = None
        if job.grammar is not None:
            job.grammar.cancel()  # still queued: never compiled
            job.grammar = None
        if job in self._prefilling:
            self._prefilling.remove(job)
            return
        row, last = self._rows.index(job), len(self._rows) - 1
        if row != last:  # keep the block packed: the last row takes the freed place
            assert self._block is not None
            self._block.copy_row(self._block, last, row, int(self._lengths[last]))
            self._rows[row] = self._rows[last]
            self._lengths[row], self._tokens[row] = self._lengths[last], self._tokens[last]
        self._rows.pop()
        self._lengths[last] = 0
        # Idle, the decode block is kept: its pages are written already. Made anew, the first
        # write of each row faulted them in again (1.1-1.7 ms a row for SmolLM2, against 0.16:
        # a burst's last first token waited for eight of them). Its memory stays at the peak
        # the rows reached, as vLLM's and llama-server's caches are allocated once; release()
        # gives it back.

    def release(self) -> None:
        for job in list(self.jobs):
            self.remove(job)
        self._block = None
        self._lengths, self._tokens = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._model.forget_bindings()
        if self._own_grammars:
            self._grammars.close()
        if self.cache is not None:
            self.cache.clear()
