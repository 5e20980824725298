import subprocess
import sys

import pytest

from ferry.server.cli import build_parser


def test_help_explains_every_serve_option():
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for option in ("--config", "--host", "--port", "--log-level"):
        assert option in help_text


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["export", "--help"]])
def test_ferry_command_prints_help(argv):
    done = subprocess.run(
        [sys.executable, "-m", "ferry.server.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "usage: ferry" in done.stdout


def test_server_never_imports_torch():
    code = "import ferry.server.app, ferry.server.cli, sys; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
