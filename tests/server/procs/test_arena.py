"""The shared memory arena: blocks of any size freed in any order, a request's large tensors
written on the API side and read back by the engine's mapping, a full arena falling back."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ferry.batcher import TensorRows
from ferry.server.procs import wire
from ferry.server.procs.arena import ALIGN, ARENA_DIR, Arena, ArenaReader, Blocks, remove_arenas

pytestmark = pytest.mark.unit

MIN_BYTES = 1024


def test_blocks_freed_in_any_order_leave_one_free_range_and_never_overlap():
    blocks, rng = Blocks(64 * ALIGN), random.Random(3)
    held: list[tuple[int, int]] = []
    for _ in range(2000):
        if held and (rng.random() < 0.5 or blocks.used == blocks.size):
            blocks.give(*held.pop(rng.randrange(len(held))))
            continue
        nbytes = ALIGN * rng.randint(1, 12)
        offset = blocks.take(nbytes)
        if offset is None:  # refused only when no free range is that large
            assert all(end - start < nbytes for start, end in blocks.free_ranges)
            continue
        assert offset + nbytes <= blocks.size
        for start, size in held:
            assert offset + nbytes <= start or start + size <= offset
        held.append((offset, nbytes))
        assert blocks.used == sum(size for _, size in held)
    for block in held:
        blocks.give(*block)
    assert blocks.used == 0 and blocks.free_ranges == [(0, blocks.size)]


@pytest.fixture
def arena():
    prefix = f"ferry-test-{random.getrandbits(32):08x}-arena-"
    made = Arena.create(prefix, 16 * 1024, MIN_BYTES)
    assert made is not None
    yield made
    made.close()
    remove_arenas(prefix)


def crossed(arena: Arena, rid: int, rows: TensorRows) -> tuple[wire.Submit, TensorRows]:
    """`rows` as the client sends them (large tensors placed) and as the engine reads them."""
    header, frames = wire.pack_request(rid, "m", rows, None, None, 0, {})
    header.arena = arena.place(rid, frames)
    frames = [f for i, f in enumerate(frames) if i not in header.arena]
    (message,) = wire.to_engine.decode(wire.encoder.encode([header]))
    assert wire.frame_count(message) == len(frames)
    reader = ArenaReader(str(arena.path))
    try:
        return message, wire.unpack_request(message, reader.frames(message.arena, frames))
    finally:
        reader.close()


def request(rng: np.random.Generator) -> TensorRows:
    tensors = {
        "small": rng.integers(0, 9, (1, 8), dtype=np.int64),  # 64 bytes: a frame
        "image": rng.random((1, 3, 17, 17), dtype=np.float32),  # 3468 bytes: the arena
        "mask": rng.integers(0, 2, (1, 300), dtype=np.int64),  # 2400 bytes: the arena
    }
    return TensorRows(tensors, 1, {})


def test_large_tensors_cross_in_the_arena_small_ones_as_frames_and_come_back_equal(arena):
    rows = request(np.random.default_rng(0))
    message, back = crossed(arena, 7, rows)
    assert set(message.arena) == {1, 2}  # image, mask (by their index in `names`)
    assert all(offset % ALIGN == 0 for offset, _ in message.arena.values())
    for name, sent in rows.tensors.items():
        np.testing.assert_array_equal(back.tensors[name], sent)
    assert arena.blocks.used > 0
    arena.free(7)
    assert arena.blocks.used == 0


def test_the_engine_reads_a_copy_so_a_freed_block_may_be_written_again(arena):
    rng = np.random.default_rng(1)
    first = request(rng)
    _, back = crossed(arena, 1, first)
    arena.free(1)
    crossed(arena, 2, request(rng))  # the same block, other values
    np.testing.assert_array_equal(back.tensors["image"], first.tensors["image"])


def test_a_full_arena_sends_frames_and_counts_a_fallback(arena):
    rng = np.random.default_rng(2)
    rid = 0
    while arena.fallbacks == 0:
        rid += 1
        rows = request(rng)
        message, back = crossed(arena, rid, rows)
        np.testing.assert_array_equal(back.tensors["image"], rows.tensors["image"])
    assert message.arena == {}  # the last one: every tensor a frame
    assert rid > 1
    arena.clear()  # the engine died: nothing reads a block any more
    assert arena.blocks.used == 0


def test_close_removes_the_file_and_an_arena_too_large_for_dev_shm_is_off():
    prefix = f"ferry-test-{random.getrandbits(32):08x}-arena-"
    arena = Arena.create(prefix, 4096, MIN_BYTES)
    assert arena is not None and arena.path.exists()
    arena.close()
    assert not list(ARENA_DIR.glob(prefix + "*"))
    assert Arena.create(prefix, 4096, 0) is None  # engine_shm_min_bytes = 0: off
    assert Arena.create(prefix, 2**62, MIN_BYTES) is None  # ENOSPC / EFBIG at start, logged
    assert not list(ARENA_DIR.glob(prefix + "*"))
