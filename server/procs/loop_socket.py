"""A ZMQ socket driven by the asyncio loop's own reader, sending in batches.

zmq.asyncio creates a future and an event-flag dance for every send and receive, which cost
more than the message itself here. This reads every waiting message in one wake-up, and
gathers what one loop turn sends to a peer (a batch's rows, many requests' submits) into one
ZMQ message of at most three frames: the msgpack list of headers, the byte sizes of the arrays
they describe (int64), and those arrays joined into one buffer, in order, each starting at a
multiple of ALIGN bytes. Each ZMQ frame costs a few microseconds of Python on both ends
(pyzmq's send and recv per part), which per array was most of the engine loop's cost per
request; the receiver hands each header memoryviews into the one buffer.
The high-water marks are off, so a send never waits (both ends are local processes that read
all the time).

ZMQ's file descriptor is edge-triggered and signals only a change: after a send, messages that
arrived meanwhile may not wake the loop, so each flush checks and schedules a read itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import msgspec
import numpy as np
import zmq

logger = logging.getLogger(__name__)
# A received header with the frames it owns.
Handler = Callable[[bytes | None, object, list[memoryview]], None]
# Every array in the joined buffer starts at a multiple of this: numpy reads any dtype in place.
ALIGN = 8
_PADDING = bytes(ALIGN)


class LoopSocket:
    def __init__(
        self,
        socket: zmq.Socket[bytes],
        decoder: msgspec.msgpack.Decoder[Any],  # either direction's list of headers
        frame_count: Callable[[object], int],
        on_message: Handler,
        routed: bool = False,
    ) -> None:
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.LINGER, 0)
        self._socket = socket
        self._decoder = decoder
        self._frame_count = frame_count
        self._on_message = on_message
        self._routed = routed  # a ROUTER: the first frame names the peer
        self._encoder = msgspec.msgpack.Encoder()
        self._loop = asyncio.get_running_loop()
        self._fd = cast(int, socket.getsockopt(zmq.FD))
        self._outbox: dict[bytes | None, tuple[list[object], list[Any]]] = {}
        self._read_scheduled = False
        self._loop.add_reader(self._fd, self._read)
        self._loop.call_soon(self._read)  # whatever came before the reader was added

    def send(self, header: object, frames: Sequence[Any] = (), peer: bytes | None = None) -> None:
        """Queued until the end of this loop turn, then sent with the turn's others."""
        if not self._outbox:
            self._loop.call_soon(self._flush)
        headers, data = self._outbox.setdefault(peer, ([], []))
        headers.append(header)
        data.extend(frames)

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for peer, (headers, frames) in outbox.items():
            message = [self._encoder.encode(headers)]
            if frames:
                message += _joined(frames)
            self._socket.send_multipart(
                [cast(bytes, peer), *message] if self._routed else message, zmq.NOBLOCK
            )
        if not self._read_scheduled and cast(int, self._socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._read_scheduled = True
            self._loop.call_soon(self._read)

    def _read(self) -> None:
        self._read_scheduled = False
        socket = self._socket
        while cast(int, socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = socket.recv_multipart(zmq.NOBLOCK)
            peer = frames.pop(0) if self._routed else None
            try:
                headers = self._decoder.decode(frames[0])
                arrays = _split(frames[1:])
            except (msgspec.DecodeError, ValueError):
                logger.exception("message dropped")
                continue
            start = 0
            for header in headers:
                end = start + self._frame_count(header)
                try:
                    self._on_message(peer, header, arrays[start:end])
                except Exception:  # one bad message must not stop every later one
                    logger.exception("message dropped")
                start = end

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        self._socket.close(0)


def _joined(frames: list[Any]) -> list[bytes]:
    """The sizes frame and the joined buffer (see the module docstring)."""
    sizes, parts = [], []
    for frame in frames:
        size = memoryview(frame).nbytes
        sizes.append(size)
        parts.append(frame)
        if size % ALIGN:
            parts.append(_PADDING[: ALIGN - size % ALIGN])
    return [np.array(sizes, dtype=np.int64).tobytes(), b"".join(parts)]


def _split(frames: list[bytes]) -> list[memoryview]:
    """The arrays of a received message, as views into its joined buffer."""
    if not frames:
        return []
    sizes_frame, buffer = frames  # ValueError for any other count
    data = memoryview(buffer)
    arrays, offset = [], 0
    for size in np.frombuffer(sizes_frame, dtype=np.int64).tolist():
        end = offset + size
        if end > len(data):
            raise ValueError("a message's sizes exceed its buffer")
        arrays.append(data[offset:end])
        offset = end + -end % ALIGN
    return arrays
