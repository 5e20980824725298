"""One send per connection per event-loop turn: uvicorn writes a response's head and its body
as two `transport.write` calls, so each reply cost two send syscalls, two TCP segments and two
wake-ups of the client. Writes made in the same turn are joined and sent at its end.

Measured under the mixed load of `bench/peers.py` (py-spy on the server's main thread): the
head's own send was a quarter of the event loop's samples, on the cores the model needs.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescedWrites:
    """Stands in for a connection's transport; writes of one loop turn go out as one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def write_now(self, data: bytes) -> None:
        """`data` sent now, after what this turn wrote before it: a whole answer that nothing
        later in the turn joins (one callback a write saved)."""
        if self._pending:
            self._pending.append(data)
            self.flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def write_eof(self) -> None:
        self.flush()  # the FIN goes after what was written
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # what was written before the close still goes out
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, pause_reading, get_extra_info, abort, ...) is the real one.
        return getattr(self._transport, name)
