"""Grammar checks off the event loop, in checker processes that may die.

A small pool of `grammar_worker` processes takes one grammar each at a time. A check that
outlasts `compile_timeout_s` has its process killed; a process that dies (llguidance's native
code crashing on a grammar) is replaced. Either way only that grammar is refused and the server
lives on. Answers are kept in a bounded LRU keyed by a digest of the grammar text, so a grammar
sent again (the same tools on every turn) costs nothing, and one that crashed a process is
refused without crashing another.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sys
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ferry.llm.grammar_bounds import GrammarLimits, GrammarRefused
from ferry.llm.grammar_worker import READY

log = logging.getLogger(__name__)
# A GBNF grammar converted to Lark may come back larger than it went in.
_LINE_LIMIT = 64 * 2**20
_RESPAWN_DELAY_S = 1.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # the folder that holds ferry/


class WorkerGone(Exception):
    """The checker process ended (or was killed) before it answered."""


@dataclass(frozen=True)
class _Answer:
    grammar: str | None = None
    error: str | None = None
    bound: str | None = None
    path: tuple[str, ...] = ()

    def result(self) -> str:
        if self.error is not None:
            raise GrammarRefused(self.error, self.bound, self.path)
        return self.grammar or ""


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def ask(self, job: dict[str, str | None]) -> _Answer:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps(job).encode() + b"\n")
            await stdin.drain()
            line = await stdout.readline()
        except (ConnectionError, ValueError) as exc:  # a broken pipe, or a line over the limit
            raise WorkerGone(str(exc)) from None
        if not line:
            raise WorkerGone(f"exit status {await self.process.wait()}")
        answer = json.loads(line)
        answer["path"] = tuple(answer.get("path", ()))
        return _Answer(**answer)

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()


class GrammarPool:
    def __init__(self, limits: GrammarLimits, workers: int = 2, cache_entries: int = 512) -> None:
        self.limits = limits
        self._size = workers
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self._cache: OrderedDict[bytes, _Answer] = OrderedDict()
        self._cache_entries = cache_entries
        self._tasks: set[asyncio.Task[Any]] = set()  # checks and respawns kept until done
        self._closed = False

    async def start(self) -> None:
        await asyncio.gather(*(self._spawn() for _ in range(self._size)))

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(w.kill() for w in list(self._all)), return_exceptions=True)
        self._all.clear()

    @property
    def pids(self) -> set[int]:
        """The checker processes now running."""
        return {w.process.pid for w in self._all}

    @property
    def cached(self) -> int:
        return len(self._cache)

    async def check(self, kind: str, text: str, tokenizer: str | None = None) -> str:
        """The grammar as the engine takes it; GrammarRefused naming the bound it is over, the
        compile error, or the crash. A caller that goes away leaves the check to finish (its
        process is neither killed nor handed to another grammar mid-way)."""
        key = hashlib.blake2b(
            json.dumps([kind, tokenizer, text]).encode("utf-8", "surrogatepass"), digest_size=20
        ).digest()
        cached = self._cache.get(key)
        if cached is None:
            task = asyncio.create_task(self._run(key, kind, text, tokenizer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            cached = await asyncio.shield(task)
        else:
            self._cache.move_to_end(key)
        return cached.result()

    async def _run(self, key: bytes, kind: str, text: str, tokenizer: str | None) -> _Answer:
        worker = await self._idle.get()
        job = {"kind": kind, "text": text, "tokenizer": tokenizer}
        try:
            answer = await asyncio.wait_for(worker.ask(job), self.limits.compile_timeout_s)
        except TimeoutError:
            await self._replace(worker)
            # Not cached: on a loaded host a grammar that fits may miss the budget once.
            return _Answer(
                error=f"checking the grammar took longer than {self.limits.compile_timeout_s} s "
                "(grammar_compile_timeout_s)",
                bound="grammar_compile_timeout_s",
            )
        except WorkerGone as exc:
            log.warning("a grammar checker process died on a %s grammar: %s", kind, exc)
            await self._replace(worker)
            answer = _Answer(error="the grammar crashed its checker (llguidance)")
        except BaseException:
            await self._replace(worker)
            raise
        else:
            self._idle.put_nowait(worker)
        self._remember(key, answer)
        return answer

    def _remember(self, key: bytes, answer: _Answer) -> None:
        self._cache[key] = answer
        while len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)

    async def _replace(self, worker: _Worker) -> None:
        self._all.discard(worker)
        await worker.kill()
        if not self._closed:
            task = asyncio.create_task(self._respawn())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _respawn(self) -> None:
        """A replacement, retried while the host refuses one (fork failing under memory
        pressure): checks wait for it rather than fail."""
        while not self._closed:
            try:
                await self._spawn()
                return
            except (OSError, RuntimeError):
                log.exception("a grammar checker process could not start; retrying")
                await asyncio.sleep(_RESPAWN_DELAY_S)

    async def _spawn(self) -> None:
        path = os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ferry.llm.grammar_worker",
            json.dumps(asdict(self.limits)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path},
            limit=_LINE_LIMIT,
        )
        worker = _Worker(process)
        self._all.add(worker)
        assert process.stdout is not None
        if (await process.stdout.readline()).decode().strip() != READY:
            self._all.discard(worker)
            await worker.kill()
            raise RuntimeError("a grammar checker process failed to start")
        self._idle.put_nowait(worker)
