"""The supervisor's run directories: a dead owner's is removed at the next start, no other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.server.procs import run_dir

pytestmark = pytest.mark.integration


def owned_by(parent: Path, name: str, owner: str | None) -> Path:
    path = parent / f"ferry-{name}"
    (path / "metrics").mkdir(parents=True)
    if owner is not None:
        (path / "owner").write_text(owner)
    return path


def own_start_time() -> str:
    return Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_only_the_directories_of_exited_owners_are_removed(tmp_path: Path):
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    dead = owned_by(tmp_path, "dead", f"{exited.stdout.strip()} 1")
    # A pid reused by another process: the start time tells them apart.
    reused = owned_by(tmp_path, "reused", f"{os.getpid()} 1")
    alive = owned_by(tmp_path, "alive", f"{os.getpid()} {own_start_time()}")
    unknown = owned_by(tmp_path, "unknown", None)  # no owner file: not ours to judge
    assert sorted(run_dir.remove_leftovers(str(tmp_path))) == sorted([str(dead), str(reused)])
    assert sorted(tmp_path.iterdir()) == sorted([alive, unknown])


def test_create_names_its_owner_and_removes_leftovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    dead = owned_by(tmp_path, "dead", "999999999 1")
    created = Path(run_dir.create())
    assert created.parent == tmp_path and not dead.exists()
    assert (created / "owner").read_text() == f"{os.getpid()} {own_start_time()}"
    assert run_dir.remove_leftovers(str(tmp_path)) == []
