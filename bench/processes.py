"""Child processes for benchmarks and tests: Ferry, Triton and the peers.

One `ManagedProcess` starts a command with its output in a log file, polls a readiness probe
until it passes (or the process dies, or time runs out: an error carrying the log's tail), and
stops it with SIGTERM, then SIGKILL after a grace period. The starters here, `ferry_server`
(server_process.py) and `unbatched_server` (unbatched_server.py) are thin uses of it.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from ferry.bench.triton_env import DEFAULT_VENV, TritonLayout

Probe = Callable[[], bool]


# Ports for servers: below every system's ephemeral range (Linux's starts at 32768, the
# IANA's at 49152), from which the kernel gives outgoing connections theirs.
SERVER_PORTS = range(20000, 32768)


def free_port() -> int:
    """A loopback port free now, for a server to bind seconds later. Not one the kernel picks
    (bind to 0): those come from the ephemeral range, where any client's connection may take
    it meanwhile, as one did under a busy test run ("address already in use")."""
    for _ in range(100):
        port = random.choice(SERVER_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # bound, or lingering: another
                continue
            return port
    with socket.socket() as sock:  # a crowded range: the kernel's pick after all
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_ok(url: str, headers: Mapping[str, str] | None = None) -> Probe:
    """A readiness probe: GET `url` answers 200 (a refused connection is "not yet")."""

    def probe() -> bool:
        try:
            return httpx.get(url, headers=headers, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


class ProcessExited(RuntimeError):
    """The process ended before its readiness probe passed."""


class ManagedProcess:
    """One child process: its command, its log file, how to tell it is ready, how to stop it.

    `start()` may be called again after `stop()` (same command, the log appended to).
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        ready: Probe,
        url: str = "",
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        grace_s: float = 15.0,
        poll_s: float = 0.1,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = log_path
        self.ready = ready
        self.url = url
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.grace_s = grace_s
        self.poll_s = poll_s  # between readiness probes
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180.0) -> ManagedProcess:
        # A file, not a pipe: nobody reads a pipe while a benchmark runs, and a full one blocks.
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            if self.ready():
                return self
            if time.monotonic() >= deadline:
                self.stop()
                raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")
            time.sleep(self.poll_s)
        raise ProcessExited(
            f"{self.name} exited with {self.process.returncode} before it was ready:\n"
            f"{self.log_tail()}"
        )

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL after the grace period; the return code (None if never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.grace_s if grace_s is None else grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 8000) -> str:
        return self.log()[-chars:]

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        died = self.process is not None and self.process.poll() is not None
        self.stop()
        if exc_type is not None and died:
            # An error beside a child that had already died is most likely its doing; its log
            # lives in a folder deleted with the run, so say now what it said.
            print(
                f"{self.name} had exited with {self.process.returncode} (pid {self.pid});"
                f" its log's tail:\n{self.log_tail()}",
                file=sys.stderr,
            )


@contextlib.contextmanager
def running(process: ManagedProcess, timeout_s: float = 180.0) -> Iterator[ManagedProcess]:
    """Start `process`, yield it once ready, stop it after (also when starting fails)."""
    with process:
        yield process.start(timeout_s)


class TritonProcess(ManagedProcess):
    """The CPU `tritonserver` of `.venv-triton` (bench/triton_env.py) serving `repository`.

    Triton refuses port 0, so free ports are picked here and kept across restarts.
    """

    def __init__(
        self, repository: Path, log_path: Path, layout: TritonLayout | None = None
    ) -> None:
        layout = layout or TritonLayout(DEFAULT_VENV)
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        command = layout.command(repository, self.http_port, self.grpc_port, self.metrics_port)
        super().__init__(
            "tritonserver",
            command,
            log_path,
            http_ok(f"http://{self.http_url}/v2/health/ready"),
            url=f"http://{self.http_url}",
            env=layout.environ(),
        )

    @property
    def http_url(self) -> str:
        """host:port, as tritonclient takes it."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def url_for(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.http_url

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text


@contextlib.contextmanager
def triton_server(
    repository: Path, log_dir: Path, layout: TritonLayout | None = None
) -> Iterator[TritonProcess]:
    triton = TritonProcess(repository, log_dir / "tritonserver.log", layout)
    with running(triton):
        yield triton
