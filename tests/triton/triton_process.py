"""Run the CPU Triton server (from `.venv-triton`, see tools/triton_env.py) as a test process."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from ferry.bench.server_process import free_port
from tools.triton_env import TritonLayout


class TritonProcess:
    """One `tritonserver` on fixed ports, so that it can be stopped and started again."""

    def __init__(self, layout: TritonLayout, repository: Path, log_path: Path) -> None:
        self.layout = layout
        self.repository = repository
        self.log_path = log_path
        # Triton refuses port 0, so free ports are picked here (and kept across restarts).
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def url(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.http_url

    def start(self, ready_timeout_s: float = 60.0) -> None:
        command = self.layout.command(
            self.repository, self.http_port, self.grpc_port, self.metrics_port
        )
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.layout.environ()
            )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited early:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                ready = httpx.get(f"http://{self.http_url}/v2/health/ready", timeout=1)
                if ready.status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {ready_timeout_s}s:\n{self.log()}")

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


@contextlib.contextmanager
def triton_server(layout: TritonLayout, repository: Path, log_dir: Path) -> Iterator[TritonProcess]:
    server = TritonProcess(layout, repository, log_dir / "tritonserver.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
