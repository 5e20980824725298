"""The loop-driven ZMQ socket: one message per peer per loop turn, frames back to their header,
each array aligned in the message's one buffer whatever the sizes before it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zmq

from ferry.server.procs import wire
from ferry.server.procs.loop_socket import LoopSocket

pytestmark = pytest.mark.unit


def test_what_one_turn_sends_arrives_in_order_with_each_header_s_frames(tmp_path):
    address = f"ipc://{tmp_path / 'sock'}"

    async def scenario() -> tuple[list, list]:
        context = zmq.Context()
        try:
            got: list = []
            aligned: list[bool] = []
            done = asyncio.Event()

            def received(peer: bytes | None, header: object, frames: list[bytes]) -> None:
                got.append((peer is not None, header, [bytes(f) for f in frames]))
                aligned.extend(np.frombuffer(f, np.uint8).ctypes.data % 8 == 0 for f in frames if f)
                if len(got) == 3:
                    done.set()

            router = context.socket(zmq.ROUTER)
            router.bind(address)
            engine = LoopSocket(router, wire.to_engine, wire.frame_count, received, routed=True)
            dealer = context.socket(zmq.DEALER)
            dealer.connect(address)
            api = LoopSocket(dealer, wire.to_api, wire.frame_count, lambda *a: None)
            sent = []
            for rid in (1, 2):
                header = wire.Submit(
                    rid,
                    "m",
                    (wire.IDS, wire.MASK, wire.TYPES),
                    ("uint8",) * 3,
                    ((3,), (5,), (0,)),
                    1,
                    {},
                    (),
                    None,
                    None,
                    0,
                )
                # Sizes no multiple of 8 (3, 5) before the next array: it still starts aligned.
                api.send(header, [bytes([rid]) * 3, b"\x01" * 5, b""])  # ids, mask, no segment ids
                sent.append(header)
            api.send(wire.Cancel(1))
            # Nothing left yet: the three wait for the end of this turn, then go as one message.
            assert got == []
            await asyncio.wait_for(done.wait(), 10)
            api.close()
            engine.close()
            assert aligned == [True] * 4
            return got, sent
        finally:
            # A failure above must not leave the context to the GC: its term() would wait on
            # the open sockets, and hang whichever test runs then.
            context.destroy(linger=0)

    got, sent = asyncio.run(scenario())
    assert [g[0] for g in got] == [True, True, True]  # the router knows the peer
    assert [g[1] for g in got] == [*sent, wire.Cancel(1)]
    assert got[0][2] == [b"\x01" * 3, b"\x01" * 5, b""]
    assert got[1][2] == [b"\x02" * 3, b"\x01" * 5, b""]
    assert got[2][2] == []
