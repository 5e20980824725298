"""What one tensor costs to cross from an API process to the engine: through the ZMQ socket
(joined into the message, sent over ipc, received and split: loop_socket.py) against through
the arena (placed in a block, copied out by the engine's mapping, freed: server/procs/arena.py),
each beyond a header-only message's cost, by tensor size. How `engine_shm_min_bytes` was chosen.

    python -m ferry.bench.arena_crossover [--bytes 4096,16384,65536,262144,1048576]

Both ends in this process (a ping-pong, one message in flight): the per-tensor work of each
path, not a server's throughput (bench.shm --api-servers 2 measures that).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import numpy as np
import zmq

from ferry.server.procs.arena import Arena, ArenaReader
from ferry.server.procs.loop_socket import _joined, _split

ARENA_BYTES = 32 * 2**20
TOTAL_BYTES = 20_000_000  # moved per size and path: the repeats of a size


def per_call_us(call: Callable[[int], None], repeats: int) -> float:
    started = time.perf_counter()
    for index in range(repeats):
        call(index)
    return (time.perf_counter() - started) / repeats * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", default="4096,16384,65536,262144,1048576")
    args = parser.parse_args(argv)
    context = zmq.Context()
    with tempfile.TemporaryDirectory() as folder:
        sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
        sender.bind(f"ipc://{folder}/socket")
        receiver.connect(f"ipc://{folder}/socket")
        arena = Arena.create(f"ferry-crossover-{time.time_ns()}-", ARENA_BYTES, 1)
        assert arena is not None, "no room in /dev/shm"
        reader = ArenaReader(str(arena.path))

        def header(_: int) -> None:
            sender.send_multipart([b"header"])
            receiver.recv_multipart()

        print("bytes      socket (us)  arena (us)   beyond a header-only message")
        try:
            for size in map(int, args.bytes.split(",")):
                frame = memoryview(np.ones(size, np.uint8)).cast("B")

                def by_socket(_: int, frame: memoryview = frame) -> None:
                    sender.send_multipart([b"header", *_joined([frame])])
                    _split(receiver.recv_multipart()[1:])

                def by_arena(rid: int, frame: memoryview = frame) -> None:
                    header(rid)
                    reader.frames(arena.place(rid, [frame]), [])
                    arena.free(rid)

                repeats = max(200, TOTAL_BYTES // size)
                alone = per_call_us(header, repeats)
                socket = per_call_us(by_socket, repeats) - alone
                shared = per_call_us(by_arena, repeats) - alone
                print(f"{size:<10d} {socket:11.1f}  {shared:10.1f}")
        finally:
            reader.close()
            arena.close()
            sender.close(0)
            receiver.close(0)
            context.term()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
