"""A Docker engine for the stack test: the running one, or a dockerd started here and stopped after.

A dockerd started here runs with `--iptables=false --ip-forward=false --bridge=none`: it changes
no firewall rule, leaves net.ipv4.ip_forward alone and makes no docker0. Containers still reach
each other on a compose network (one bridge, no forwarding) and the host reaches published ports
through docker-proxy; builds use the host's network. On stop, whatever it did change anyway is put
back: bridges it left, ip_forward, the iptables FORWARD policy. An engine that was already running
is used as it is and left running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ferry.bench.processes import ManagedProcess, running

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
DOCKERD_ARGS = ["--iptables=false", "--ip-forward=false", "--bridge=none"]


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def engine_running() -> bool:
    return (
        subprocess.run(
            ["docker", "info"], capture_output=True, timeout=30, stdin=subprocess.DEVNULL
        ).returncode
        == 0
    )


@dataclass(frozen=True)
class HostNetwork:
    """What a dockerd may change on the host: links, ip_forward, the FORWARD chain's policy."""

    links: frozenset[str]
    ip_forward: str
    forward_policy: str | None

    @classmethod
    def capture(cls) -> HostNetwork:
        return cls(frozenset(os.listdir("/sys/class/net")), _read(IP_FORWARD), _forward_policy())

    def restore(self) -> list[str]:
        """Put back what changed since capture(); returns what it undid."""
        undone = []
        for link in sorted(set(os.listdir("/sys/class/net")) - self.links):
            if link == "docker0" or link.startswith(("br-", "veth")):
                subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
                undone.append(f"link {link}")
        if _read(IP_FORWARD) != self.ip_forward:
            IP_FORWARD.write_text(self.ip_forward + "\n")
            undone.append(f"ip_forward={self.ip_forward}")
        if self.forward_policy and _forward_policy() != self.forward_policy:
            subprocess.run(["iptables", "-P", "FORWARD", self.forward_policy], check=True)
            undone.append(f"FORWARD policy {self.forward_policy}")
        return undone


def _read(path: Path) -> str:
    return path.read_text().strip()


def _forward_policy() -> str | None:
    if not shutil.which("iptables"):
        return None
    out = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    policies = [line.split()[2] for line in out.splitlines() if line.startswith("-P FORWARD")]
    return policies[0] if policies else None


@contextlib.contextmanager
def docker_engine(start_timeout_s: float = 60) -> Iterator[None]:
    """Yield with a reachable engine; stop and clean up after one that was started here."""
    if engine_running():
        yield
        return
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        raise RuntimeError(
            "no Docker engine reachable, and this is not root with dockerd installed to start one "
            "(run `bash tools/install_docker.sh`, or start Docker)"
        )
    before = HostNetwork.capture()
    with tempfile.TemporaryDirectory(prefix="ferry-dockerd-") as tmp:
        dockerd = ManagedProcess(
            "dockerd",
            ["dockerd", *DOCKERD_ARGS],
            Path(tmp) / "dockerd.log",
            engine_running,
            grace_s=60,
            poll_s=0.5,
        )
        try:
            with running(dockerd, start_timeout_s):
                yield
        finally:
            before.restore()
