"""tools/install_docker.sh and tools/docker_base_image.sh: strict bash; the installer a no-op once
everything is there (test_docker_stack.py runs both for real)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.deploy.deploy_support import ROOT

SCRIPTS = ["tools/install_docker.sh", "tools/docker_base_image.sh"]
NEEDED = ["dockerd", "docker", "docker-compose", "debootstrap", "ip", "iptables"]


@pytest.mark.skipif(not all(map(shutil.which, NEEDED)), reason="not installed yet")
def test_install_script_is_idempotent():
    result = subprocess.run(
        ["bash", str(ROOT / "tools/install_docker.sh")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_are_strict_bash(script):
    text = (ROOT / script).read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    assert "</dev/null" in text or "apt_install " in text  # nothing waits on stdin in CI
    subprocess.run(["bash", "-n", str(ROOT / script)], check=True)


def test_installer_names_every_command_it_checks():
    text = (ROOT / "tools/install_docker.sh").read_text()
    assert f"needed=({' '.join(NEEDED)})" in text
    for package in ("docker.io", "docker-compose", "debootstrap", "iproute2", "iptables"):
        assert package in text
