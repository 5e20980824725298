"""tools/install_prometheus.sh: a no-op, with no stdin, once Prometheus is installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.deploy.deploy_support import ROOT


@pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")), reason="not installed yet"
)
def test_install_script_is_idempotent():
    result = subprocess.run(
        ["bash", str(ROOT / "tools/install_prometheus.sh")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""


def test_install_script_is_strict_bash():
    text = (ROOT / "tools/install_prometheus.sh").read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    assert "apt_install prometheus" in text  # tools/apt_install.sh: no prompt, no stdin
    subprocess.run(["bash", "-n", str(ROOT / "tools/install_prometheus.sh")], check=True)
