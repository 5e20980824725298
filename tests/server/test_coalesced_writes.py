"""CoalescedWrites (server/coalesced_writes.py): the writes of one loop turn leave as one send,
nothing is lost at a close, and everything else is the real transport's."""

from __future__ import annotations

import asyncio
import socket

import pytest

from ferry.server.coalesced_writes import CoalescedWrites

pytestmark = pytest.mark.unit


class Pair:
    """A real transport on one end of a socket pair, and the raw other end to read from."""

    async def __aenter__(self) -> Pair:
        ours, self.peer = socket.socketpair()
        self.peer.setblocking(False)
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        self.sends = 0
        write = self.transport.write

        def counted(data: bytes) -> None:
            self.sends += 1
            write(data)

        self.transport.write = counted  # type: ignore[method-assign]
        self.writes = CoalescedWrites(self.transport, loop)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.transport.abort()
        self.peer.close()

    async def received(self, size: int) -> bytes:
        loop = asyncio.get_running_loop()
        data = b""
        while len(data) < size:
            data += await loop.sock_recv(self.peer, size - len(data))
        return data


async def test_head_and_body_written_in_one_turn_leave_as_one_send():
    async with Pair() as pair:
        pair.writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        pair.writes.write(b"{}")
        assert pair.sends == 0  # held until the turn ends
        await asyncio.sleep(0)
        assert pair.sends == 1
        assert await pair.received(40) == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
        pair.writes.write(b"next")  # a later turn: a send of its own
        await asyncio.sleep(0)
        assert pair.sends == 2 and await pair.received(4) == b"next"


async def test_a_close_sends_what_was_written_first():
    async with Pair() as pair:
        pair.writes.write(b"503 then close")
        pair.writes.close()
        assert pair.sends == 1 and pair.writes.is_closing()
        assert await pair.received(14) == b"503 then close"
        await asyncio.sleep(0)  # the scheduled flush finds nothing left to send
        assert pair.sends == 1
