import argparse
import subprocess
import sys

import pytest

from ferry.server.cli import add_serve_command

pytestmark = pytest.mark.integration


def test_help_explains_every_serve_option():
    commands = argparse.ArgumentParser(prog="ferry").add_subparsers()
    add_serve_command(commands)
    help_text = commands.choices["serve"].format_help()
    for option in ("--config", "--host", "--port", "--log-level"):
        assert option in help_text


def test_server_never_imports_torch():
    code = "import ferry.server.app, ferry.cli, sys; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_server_never_imports_the_benchmarks_or_the_exporters():
    code = (
        "import ferry.server.app, ferry.server.cli, sys; print(sorted("
        "m for m in sys.modules if m.startswith(('ferry.bench', 'ferry.exporters'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
