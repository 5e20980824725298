"""A child of the supervisor stops when the supervisor is gone (killed: no SIGTERM reaches it)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


def on_parent_exit(parent_pid: int, callback: Callable[[], None]) -> None:
    """Call `callback` on the running loop once process `parent_pid` has exited."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        loop.call_soon(callback)
        return

    def exited() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        callback()

    loop.add_reader(fd, exited)
