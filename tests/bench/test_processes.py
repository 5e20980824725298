"""ManagedProcess on real child processes: readiness, early death, timeouts, stop and restart."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from ferry.bench import images
from ferry.bench.processes import (
    SERVER_PORTS,
    ManagedProcess,
    ProcessExited,
    free_port,
    http_ok,
    running,
)

pytestmark = pytest.mark.integration

# Prints "ready <pid>" once its SIGTERM handling is set up, then waits to be stopped.
CHILD = """
import signal, sys, time
mode = sys.argv[1]
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif mode == "graceful":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
import os
print("ready", os.getpid(), flush=True)
while True:
    time.sleep(0.05)
"""


def child(tmp_path: Path, mode: str, **kwargs) -> ManagedProcess:
    log = tmp_path / f"{mode}.log"

    def ready() -> bool:  # this run's line, not one an earlier run left in the log
        return f"ready {process.pid}" in log_text(log)

    process = ManagedProcess(mode, [sys.executable, "-c", CHILD, mode], log, ready, **kwargs)
    return process


def log_text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_graceful_stop_returns_the_exit_code(tmp_path):
    with running(child(tmp_path, "graceful")) as process:
        assert process.pid and process.process.poll() is None
        assert process.stop() == 3


def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    process = child(tmp_path, "ignore", grace_s=0.5)
    with running(process):
        pass
    assert process.process.returncode == -signal.SIGKILL


def test_dying_before_ready_raises_with_the_log_tail(tmp_path):
    command = [sys.executable, "-c", "print('no model here'); raise SystemExit(2)"]
    process = ManagedProcess("doomed", command, tmp_path / "doomed.log", lambda: False)
    with pytest.raises(ProcessExited, match=r"(?s)doomed exited with 2.*no model here"):
        process.start()


@pytest.mark.parametrize("died", [True, False], ids=["died", "alive"])
def test_an_error_beside_a_dead_child_prints_its_log(tmp_path, capsys, died):
    with pytest.raises(ConnectionError), running(child(tmp_path, "graceful")) as process:
        if died:
            process.process.kill()
            process.process.wait()
        raise ConnectionError("the child stopped answering")
    err = capsys.readouterr().err
    said = f"graceful had exited with {-signal.SIGKILL} (pid {process.pid}); its log's tail:\n"
    assert (said + f"ready {process.pid}" in err) is died


def test_never_ready_times_out_and_is_stopped(tmp_path):
    process = child(tmp_path, "graceful")
    process.ready = lambda: False
    with pytest.raises(TimeoutError, match=r"graceful not ready after 0\.5s"):
        process.start(timeout_s=0.5)
    assert process.process.poll() is not None  # stopped, not left running


def test_restart_appends_to_the_log(tmp_path):
    process = child(tmp_path, "graceful")
    with running(process):
        first = process.pid
        process.stop()
        process.start()
        assert process.pid != first
    assert process.log().count("ready") == 2


def test_http_probe_is_false_until_something_answers_200(tmp_path):
    port = free_port()
    probe = http_ok(f"http://127.0.0.1:{port}/")
    assert probe() is False  # connection refused: not yet, not an error
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    server = ManagedProcess("http.server", command, tmp_path / "http.log", probe, cwd=tmp_path)
    with running(server):
        assert probe() is True
    assert probe() is False


def test_stop_before_start_is_a_no_op(tmp_path):
    assert child(tmp_path, "graceful").stop() is None


def test_bench_images_floor_server_answers_the_live_poll(tmp_path):
    with running(images.bare_server(tmp_path)) as bare, images.LivePoll(bare.url) as poll:
        time.sleep(0.2)
    assert len(poll.latencies_s) >= 5  # every poll answered 200 (LivePoll asserts it)


def test_a_free_port_is_outside_the_range_clients_are_given():
    # A port the kernel gives an outgoing connection could be taken before the server binds it.
    with (
        socket.create_server(("127.0.0.1", 0)) as listening,
        socket.create_connection(listening.getsockname()) as client,
    ):
        given = client.getsockname()[1]
    ports = {free_port() for _ in range(20)}
    assert given not in SERVER_PORTS and ports <= set(SERVER_PORTS)
    for port in ports:  # each free for a server to bind
        with socket.create_server(("127.0.0.1", port)):
            pass
