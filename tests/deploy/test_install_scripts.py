"""tools/install_docker.sh, tools/install_prometheus.sh, tools/install_chromium.sh and
tools/docker_base_image.sh: strict
bash that never waits on stdin, each installer a no-op once what it checks for is there
(test_docker_stack.py runs the Docker ones for real)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.deploy.deploy_support import ROOT

pytestmark = pytest.mark.system

# Each installer: the commands it checks for before installing, and the Debian packages it
# installs them from (tools/apt_install.sh).
INSTALLERS = {
    "tools/install_docker.sh": (
        ("dockerd", "docker", "docker-compose", "debootstrap", "ip", "iptables"),
        ("docker.io", "docker-compose", "debootstrap", "iproute2", "iptables"),
    ),
    "tools/install_prometheus.sh": (
        ("prometheus", "promtool", "docker-compose"),
        ("prometheus", "docker-compose"),
    ),
    "tools/install_chromium.sh": (("chromium",), ("chromium",)),
}
SCRIPTS = [*INSTALLERS, "tools/docker_base_image.sh"]


@pytest.mark.parametrize("script", INSTALLERS)
def test_install_script_is_idempotent(script):
    commands, _ = INSTALLERS[script]
    missing = [command for command in commands if shutil.which(command) is None]
    assert not missing, f"{missing} missing: `make test` runs `bash {script}` before the suite"
    result = subprocess.run(
        ["bash", str(ROOT / script)],
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


@pytest.mark.parametrize("script", INSTALLERS)
def test_installer_checks_and_installs_what_it_names(script):
    commands, packages = INSTALLERS[script]
    text = (ROOT / script).read_text()
    before_exit = text.partition("exit 0")[0]  # what decides that nothing needs installing
    needed = re.search(r"^needed=\((.*)\)$", before_exit, re.MULTILINE)
    checked = set(needed.group(1).split() if needed else ())
    checked |= set(re.findall(r"command -v ([\w-]+)", before_exit))
    assert checked == set(commands)
    (install,) = re.findall(r"^apt_install (.*)$", text, re.MULTILINE)
    assert set(packages) <= set(install.split())
