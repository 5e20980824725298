"""The `ferry` command: each package's subcommands under one parser, also as `python -m ferry`."""

import subprocess
import sys

import pytest

from ferry.cli import build_parser

pytestmark = pytest.mark.integration


def test_the_command_has_each_packages_subcommands():
    commands = build_parser()._subparsers._group_actions[0].choices
    assert set(commands) == {"serve", "export", "bench"}


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["export", "--help"]])
def test_ferry_command_prints_help(argv):
    done = subprocess.run(
        [sys.executable, "-m", "ferry", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "usage: ferry" in done.stdout
