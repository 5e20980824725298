"""A running server's processes (`api_servers = N`, `replicas = N`): which child is which, and
waiting on them."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import httpx

from ferry.bench.api_servers import process_roles
from tests.support import waiting

READY_TIMEOUT_S = 90.0


def pids(server, role: str) -> list[int]:
    return sorted(p for p, r in process_roles(server.pid).items() if r == role)


def wait_until(check, timeout_s: float = READY_TIMEOUT_S, what: str = ""):
    return waiting.wait_until(check, timeout_s, what, interval_s=0.05)


def ready(server) -> bool:
    return readiness(server) == 200


def readiness(server) -> int | None:
    """/health/ready's status; None while nothing answers."""
    try:
        return httpx.get(f"{server.url}/health/ready", timeout=5).status_code
    except httpx.TransportError:
        return None


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for its parent to reap it counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def api_process_of(server, client_port: int, role: str = "api") -> int | None:
    """The API process (or replica: `role`) holding the server's end of the loopback connection
    from `client_port` (they accept from one socket, whichever is first)."""
    server_port = int(server.url.rsplit(":", 1)[1])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()  # sl, local address, remote address, ..., inode (10th)
            local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
            if (local, remote) == (server_port, client_port):
                inodes.add(f"socket:[{fields[9]}]")
    for pid in pids(server, role):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) in inodes:
                    return pid
            except OSError:  # closed meanwhile
                continue
    return None


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (children first, then theirs)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        for child in map(int, children):
            found += [child, *descendants(child)]
    return found


def listening_socket(server) -> str:
    """The server's listening TCP socket as /proc's fd links name it (`socket:[inode]`)."""
    port = int(server.url.rsplit(":", 1)[1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()  # sl, local address, remote address, state (0A: LISTEN), ...
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                return f"socket:[{fields[9]}]"
    raise LookupError(f"nothing listens on port {port}")


def holds(pid: int, link: str) -> bool:
    """Whether process `pid` has an open fd on `link` (as `listening_socket` names one)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(fd) == link:
                return True
    return False
