"""tools/apt_install.sh, the one way the install scripts get Debian packages: never a prompt or a
read from stdin, and the index refreshed only when an install from the current one fails. Runs
the real function against an `apt-get` stand-in on PATH that logs its calls (the real one would
change the host). As root, like CI."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.deploy_support import ROOT

pytestmark = pytest.mark.system

FAKE_APT = """#!/usr/bin/env bash
# Logs how it was called; fails `install` until `update` ran when FAIL_FIRST is set.
stdin=$(cat 2>/dev/null | head -c 10 | wc -c)
echo "$* stdin=$stdin frontend=${DEBIAN_FRONTEND:-}" >> "$LOG"
if [ "$1" = update ]; then touch "$LOG.updated"; fi
if [ "$1" = install ] && [ -n "${FAIL_FIRST:-}" ] && [ ! -e "$LOG.updated" ]; then exit 100; fi
exit 0
"""


def run_apt_install(tmp_path: Path, fail_first: bool) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT)
    (bin_dir / "apt-get").chmod(0o755)
    log = tmp_path / "apt.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log)}
    if fail_first:
        env["FAIL_FIRST"] = "1"
    script = f'set -euo pipefail; source "{ROOT}/tools/apt_install.sh"; apt_install pkg-a pkg-b'
    # A stdin with data: an apt-get that read it could hang a CI job waiting on a prompt.
    subprocess.run(["bash", "-c", script], input="y\n" * 100, text=True, env=env, check=True)
    return log.read_text().splitlines()


def test_installs_without_prompt_or_stdin_and_skips_the_update_when_not_needed(tmp_path):
    calls = run_apt_install(tmp_path, fail_first=False)
    assert calls == [
        "install -y -q --no-install-recommends pkg-a pkg-b stdin=0 frontend=noninteractive"
    ]


def test_refreshes_the_index_once_when_the_install_fails(tmp_path):
    calls = run_apt_install(tmp_path, fail_first=True)
    assert [call.split()[0] for call in calls] == ["install", "update", "install"]
    assert all("stdin=0" in call for call in calls)
