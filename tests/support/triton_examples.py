"""Run one of NVIDIA's Triton client scripts (tests/clients/triton_examples/, BSD-3) unchanged
but for the server's address, as a user migrating from Triton would.

A script with a `-u/--url` flag gets the address there; one that hard-codes Triton's default
ports (memory_growth_test.py, Triton's qa tests) runs from a copy with only `localhost:8000`
and `localhost:8001` replaced.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "clients" / "triton_examples"
QA = Path(__file__).resolve().parents[1] / "clients" / "triton_qa"
TRITON_HTTP, TRITON_GRPC = "localhost:8000", "localhost:8001"
# What an example prints when one of its checks fails (it exits 1 too, mostly).
FAILURE = re.compile(r"\berror\b|FAILED|Traceback", re.IGNORECASE)
# Some print PASS after their last check and nothing when it fails, exiting 0 either way.
PASS_LINE = 'print("PASS'


def uses_grpc(script: str, args: tuple[str, ...]) -> bool:
    """gRPC by the script's name, or by its `-i/--protocol` flag (image_client.py)."""
    for flag in ("-i", "--protocol"):
        if flag in args and args.index(flag) + 1 < len(args):
            return args[args.index(flag) + 1].lower() == "grpc"
    return "grpc" in script


def example_command(
    source: Path, http: str, grpc: str, args: tuple[str, ...], tmp: Path
) -> list[str]:
    """The command running `source` against Ferry's addresses (host:port)."""
    text = source.read_text()
    if '"--url"' in text:
        address = grpc if uses_grpc(source.name, args) else http
        return [sys.executable, str(source), "-u", address, *args]
    copy = tmp / source.name
    copy.write_text(text.replace(TRITON_HTTP, http).replace(TRITON_GRPC, grpc))
    return [sys.executable, str(copy), *args]


def run_example(
    script: str | Path, http: str, grpc: str, *args: str, tmp: Path, timeout_s: float = 180.0
) -> str:
    """The script's output (a name in EXAMPLES, or a path); fails the test unless it exits 0
    without printing an error (and says PASS, if it is one that does)."""
    source = EXAMPLES / script if isinstance(script, str) else script
    what = f"{source.name} {' '.join(args)}"
    run = subprocess.run(
        example_command(source, http, grpc, args, tmp),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(source.parent)},
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"{what} exited {run.returncode}:\n{output}"
    assert not FAILURE.search(output), f"{what} printed an error:\n{output}"
    if PASS_LINE in source.read_text():
        assert "PASS" in output, f"{what} never said PASS:\n{output}"
    return output


def run_qa(
    script: str, server: Any, tests: list[str], *, tmp: Path, timeout_s: float = 300.0
) -> str:
    """Some of the unittest cases of one of Triton's qa scripts (`L0_http/http_test.py`), by
    name (`HttpTest.test_raw_binary`), against `server` (its `http_address` and `grpc_address`);
    fails the test unless they all pass. The scripts import `qa/common` as Triton's tree has it
    beside them."""
    source = QA / script
    http, grpc = server.http_address, server.grpc_address
    run = subprocess.run(
        example_command(source, http, grpc, (), tmp)[:2] + tests,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(QA / "common")},
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"{script} exited {run.returncode}:\n{output}"
    assert f"Ran {len(tests)} test" in output and "\nOK" in output, output
    return output
