"""A child notices its supervisor's exit at once, through a pidfd."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from ferry.server.procs.parent import on_parent_exit

pytestmark = pytest.mark.integration


def test_the_callback_runs_when_the_process_exits_and_at_once_if_it_is_gone():
    async def scenario() -> tuple[bool, bool]:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        exited = asyncio.Event()
        on_parent_exit(process.pid, exited.set)
        await asyncio.sleep(0)
        alive_seen = not exited.is_set()
        process.kill()
        await asyncio.wait_for(exited.wait(), 10)
        process.wait()
        gone = asyncio.Event()
        on_parent_exit(process.pid, gone.set)  # reaped: no such process any more
        await asyncio.wait_for(gone.wait(), 10)
        return alive_seen, gone.is_set()

    assert asyncio.run(scenario()) == (True, True)
