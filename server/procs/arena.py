"""An API process's shared memory arena: large request tensors cross to the engine through it.

With `api_servers > 1` a request's tensors of at least `engine_shm_min_bytes` are written into
a block of this arena (one block per request) and its Submit names (offset, bytes) in place of
their frames; smaller ones keep their frame, which costs less than a block for them. The socket
then carries a header, not the tensor: no join into the message, no kernel copies on either
side (Triton's system shared memory does the same for its clients; vLLM's shm_broadcast for
its workers, with a ring of fixed chunks whose writer waits when it is full; here blocks of any
size are freed in any order, and a full arena falls back to frames as vLLM's oversized message
falls back to its socket).

The arena is one file under /dev/shm, created by its API process (mode 0600) and mapped
read-only by the engine, which copies each tensor out as it reads the request, so every answer
the engine sends about a request (its rows, a failure, the reply to a cancel) comes after its
last read of the block: the API process frees the block then, and clears every block when the
engine dies. A full arena is not a failure nor a wait: the tensors go as frames.

The pages are reserved when the arena is made (posix_fallocate): a /dev/shm too small for it
(Docker's default is 64 MiB) turns the arena off with a warning at start, instead of a SIGBUS
on a later write. Its name starts with the supervisor's run directory's (run_dir.py): the API
process removes it when it exits, the supervisor when it reaps one that crashed, and the next
start when the whole run was killed.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)
ARENA_DIR = Path("/dev/shm")
# Each tensor starts at a multiple of this: numpy reads any dtype in place, on its own lines.
ALIGN = 64
Frame = bytes | memoryview


def arena_prefix(run_dir: str) -> str:
    """The names of a run's arenas: its run directory's name, then `-arena-<pid>`."""
    return f"{os.path.basename(run_dir)}-arena-"


def remove_arenas(prefix: str, pid: int | None = None) -> None:
    """Remove the arena of process `pid` (None: every arena of the prefix)."""
    pattern = f"{prefix}{pid}" if pid is not None else f"{prefix}*"
    for path in ARENA_DIR.glob(pattern):
        with contextlib.suppress(OSError):  # gone already, or not ours
            path.unlink()


class Blocks:
    """First fit over the free ranges, sorted by offset, merged with their neighbours when
    freed: blocks of any size, freed in any order (answers do not come in request order)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._starts = [0]  # the free ranges' offsets, ascending
        self._ends = [size]
        self.used = 0

    def take(self, nbytes: int) -> int | None:
        """The offset of a free block of `nbytes` (a multiple of ALIGN), or None: no room."""
        for index, (start, end) in enumerate(zip(self._starts, self._ends, strict=True)):
            if end - start >= nbytes:
                if end - start == nbytes:
                    del self._starts[index], self._ends[index]
                else:
                    self._starts[index] = start + nbytes
                self.used += nbytes
                return start
        return None

    def give(self, offset: int, nbytes: int) -> None:
        index = bisect.bisect(self._starts, offset)
        end = offset + nbytes
        self.used -= nbytes
        joins_next = index < len(self._starts) and self._starts[index] == end
        joins_previous = index > 0 and self._ends[index - 1] == offset
        if joins_previous and joins_next:
            self._ends[index - 1] = self._ends[index]
            del self._starts[index], self._ends[index]
        elif joins_previous:
            self._ends[index - 1] = end
        elif joins_next:
            self._starts[index] = offset
        else:
            self._starts.insert(index, offset)
            self._ends.insert(index, end)

    @property
    def free_ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))


def _aligned(nbytes: int) -> int:
    return nbytes + -nbytes % ALIGN


class Arena:
    """The API process's side: its requests' blocks, written here, freed at their answers."""

    def __init__(self, path: Path, memory: mmap.mmap, min_bytes: int) -> None:
        self.path = path
        self._memory = memory
        self._view = memoryview(memory)
        self._min_bytes = min_bytes
        self.blocks = Blocks(len(memory))
        self._held: dict[int, tuple[int, int]] = {}  # per request id, its block
        self.fallbacks = 0  # requests whose large tensors went as frames: the arena was full

    @classmethod
    def create(cls, prefix: str, size: int, min_bytes: int) -> Arena | None:
        """This process's arena, or None (off: `min_bytes` 0, or no room in /dev/shm)."""
        if not min_bytes or not size:
            return None
        path = ARENA_DIR / f"{prefix}{os.getpid()}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            logger.warning("no shared memory arena (%s): tensors cross the socket", exc)
            return None
        try:
            os.posix_fallocate(fd, 0, size)  # the pages now, or ENOSPC now: never a SIGBUS later
            memory = mmap.mmap(fd, size)
        except OSError as exc:
            path.unlink(missing_ok=True)
            logger.warning(
                "no shared memory arena of %d bytes in %s (%s): tensors cross the socket; "
                "lower engine_shm_arena_bytes or give the container more /dev/shm",
                size,
                ARENA_DIR,
                exc,
            )
            return None
        finally:
            os.close(fd)
        return cls(path, memory, min_bytes)

    def place(self, rid: int, frames: Sequence[Frame]) -> dict[int, tuple[int, int]]:
        """Write request `rid`'s large frames into one block: {frame index: (offset, bytes)};
        empty when none is large, or when the arena has no room for them (they stay frames)."""
        large = [i for i, frame in enumerate(frames) if len(frame) >= self._min_bytes]
        if not large:
            return {}
        sizes = [memoryview(frames[i]).nbytes for i in large]
        total = sum(map(_aligned, sizes))
        start = self.blocks.take(total)
        if start is None:
            self.fallbacks += 1
            return {}
        self._held[rid] = (start, total)
        placed, offset = {}, start
        for index, nbytes in zip(large, sizes, strict=True):
            self._view[offset : offset + nbytes] = frames[index]
            placed[index] = (offset, nbytes)
            offset += _aligned(nbytes)
        return placed

    def free(self, rid: int) -> None:
        """Request `rid` answered: the engine has read its block."""
        block = self._held.pop(rid, None)
        if block is not None:
            self.blocks.give(*block)

    def clear(self) -> None:
        """The engine died: nothing will read any block."""
        for rid in list(self._held):
            self.free(rid)

    def close(self) -> None:
        self._view.release()
        self._memory.close()
        self.path.unlink(missing_ok=True)


class ArenaReader:
    """The engine's side: one API process's arena, mapped read-only once."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self._memory = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._view = memoryview(self._memory)

    def frames(self, placed: dict[int, tuple[int, int]], frames: Sequence[Frame]) -> list[Frame]:
        """A request's frames in order, those in the arena copied out of it (its block is
        freed once the engine answers, maybe while the request still waits in a batcher)."""
        merged: list[Frame] = []
        sent = iter(frames)
        for index in range(len(frames) + len(placed)):
            block = placed.get(index)
            if block is None:
                merged.append(next(sent))
                continue
            offset, nbytes = block
            if offset < 0 or offset + nbytes > len(self._view):
                raise ValueError("a tensor's block lies outside its arena")
            merged.append(bytes(self._view[offset : offset + nbytes]))
        return merged

    def close(self) -> None:
        self._view.release()
        self._memory.close()
