"""`ferry bench`: its help, and a tiny sweep against a real `ferry serve`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ferry.bench.server_process import DEFAULT_MODEL, REPO, default_model_config, ferry_server
from ferry.cli import main

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ferry():
    with ferry_server([default_model_config()]) as server:
        yield server


def test_help_explains_every_option():
    done = subprocess.run(
        [sys.executable, "-m", "ferry", "bench", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    for option in (
        "--url",
        "--protocol",
        "--model",
        "--concurrency",
        "--requests",
        "--seconds",
        "--step-timeout",
        "--warmup",
        "--min-len",
        "--max-len",
        "--seed",
        "--onnx",
        "--no-onnx",
        "--plot",
        "--no-plot",
    ):
        assert option in done.stdout


def test_sweep_prints_the_table_and_writes_a_png(ferry, tmp_path, capsys):
    plot = tmp_path / "sweep.png"
    code = main(
        [
            "bench",
            "--url",
            ferry.url,
            "--concurrency",
            "1,4",
            "--requests",
            "20",
            "--warmup",
            "4",
            "--plot",
            str(plot),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["4"])]
    assert [row[0] for row in rows] == ["1", "4"]
    assert all(row[4] == "0" for row in rows)  # errors column
    assert "ceiling:" in out
    assert plot.read_bytes()[:8] == PNG_SIGNATURE


def test_sweep_speaks_kserve_v2(ferry, capsys):
    code = main(
        [
            "bench",
            "--url",
            ferry.url,
            "--protocol",
            "kserve",
            "--model",
            DEFAULT_MODEL,
            "--concurrency",
            "2",
            "--requests",
            "10",
            "--warmup",
            "0",
            "--no-onnx",
            "--no-plot",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert f"/v2/models/{DEFAULT_MODEL}/infer" in out
    (row,) = [line.split() for line in out.splitlines() if line.split()[:1] == ["2"]]
    assert row[4] == "0"


def test_kserve_without_a_model_is_refused(capsys):
    assert main(["bench", "--protocol", "kserve", "--no-onnx", "--no-plot"]) == 2
    assert "model name" in capsys.readouterr().err


def test_an_unreachable_server_is_an_error_not_a_traceback(capsys):
    from ferry.bench.processes import free_port

    url = f"http://127.0.0.1:{free_port()}"
    args = ["bench", "--url", url, "--concurrency", "1", "--requests", "2", "--warmup", "0"]
    assert main([*args, "--no-onnx", "--no-plot"]) == 1
    assert "cannot benchmark" in capsys.readouterr().err
