"""The locks (locks/*.txt, written by `make lock`) are what every install path uses: each still
satisfies pyproject.toml's ranges, pins every package with its hashes, and the project venv holds
exactly what its lock names."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.deploy.deploy_support import ROOT

pytestmark = pytest.mark.unit

LOCKS = ROOT / "locks"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Each lock: the Python it was resolved for, and the pyproject.toml extras it must satisfy
# (the main dependencies always).
LOCKED_EXTRAS = {
    "dev.txt": ("3.11", ("cpu", "export", "test")),
    "image-cpu.txt": ("3.11", ("cpu", "triton")),
    "image-gpu.txt": ("3.11", ("gpu", "triton")),
    "image-gpu-vllm.txt": ("3.11", ("gpu", "triton", "vllm")),
    "gpu-test.txt": ("3.12", ("gpu", "torch", "gpu-test", "test", "vllm")),
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pins(lock: str) -> dict[str, Version]:
    """name -> version of every package a lock pins."""
    found = {}
    for line in (LOCKS / lock).read_text().splitlines():
        if m := _PIN.match(line):
            found[canonicalize_name(m.group(1))] = Version(m.group(2))
    return found


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    listed = PYPROJECT["dependencies"] + [
        r for extra in extras for r in PYPROJECT["optional-dependencies"][extra]
    ]
    return [Requirement(r) for r in listed]


@pytest.mark.parametrize("lock", sorted(LOCKED_EXTRAS))
def test_each_lock_satisfies_pyproject(lock):
    python, extras = LOCKED_EXTRAS[lock]
    environment = {"python_version": python, "sys_platform": "linux", "platform_system": "Linux"}
    locked = pins(lock)
    unmet = []
    for req in requirements(extras):
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        version = locked.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req} (locked: {version})")
    assert not unmet, f"locks/{lock} no longer satisfies pyproject.toml, run `make lock`: {unmet}"


@pytest.mark.parametrize("lock", sorted(p.name for p in LOCKS.glob("*.txt")))
def test_every_locked_package_is_pinned_with_its_hashes(lock):
    entries = re.split(r"\n(?=\S)", (LOCKS / lock).read_text())
    for entry in entries:
        first = entry.splitlines()[0]
        if first.startswith(("#", "-e ")) or not first.strip():
            continue
        assert _PIN.match(first), f"{lock}: {first!r} is not pinned with =="
        assert "--hash=sha256:" in entry, f"{lock}: {first!r} has no hash"


def test_each_lock_is_made_from_its_input():
    # A hand edit of an .in file without `make lock` leaves the lock stale.
    for source in LOCKS.glob("*.in"):
        lock = pins(source.with_suffix(".txt").name)
        for line in source.read_text().splitlines():
            line = line.split("#")[0].strip()
            if not line or line.startswith("-"):
                continue
            req = Requirement(line)
            version = lock.get(canonicalize_name(req.name))
            assert version is not None and req.specifier.contains(version, prereleases=True), (
                f"{source.name}: {req} is not what {source.stem}.txt pins ({version})"
            )


def test_the_root_lock_pins_what_the_dev_lock_pins():
    packages = tomllib.loads((ROOT / "pylock.toml").read_text())["packages"]
    root = {canonicalize_name(p["name"]): Version(p["version"]) for p in packages if "version" in p}
    assert root == pins("dev.txt")


def test_the_project_venv_holds_exactly_the_lock():
    expected = {**pins("dev.txt"), **pins("nodeps.txt")}
    expected[canonicalize_name(metadata.metadata("ferry")["Name"])] = Version(
        metadata.version("ferry")
    )
    installed = {
        canonicalize_name(d.metadata["Name"]): Version(d.version) for d in metadata.distributions()
    }
    moved = {
        name: (str(expected.get(name)), str(installed.get(name)))
        for name in expected.keys() | installed.keys()
        if expected.get(name) != installed.get(name)
    }
    assert not moved, f"(lock, .venv) differ; run `make setup`: {moved}"


def test_lock_diff_names_what_moved(tmp_path):
    # `make test-latest` prints this: versions changed, packages added and removed, by name.
    sys.path.insert(0, str(ROOT / "tools"))
    import lock_diff

    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("numpy==2.4.6 \\\n    --hash=sha256:aa\nsix==1.16.0\nlm-eval==0.4.13\n")
    new.write_text("numpy==2.5.0\nlm-eval[api]==0.4.13\nidna==3.10\n")
    assert lock_diff.moved(lock_diff.pins(old), lock_diff.pins(new)) == [
        "idna: (none) -> 3.10",
        "numpy: 2.4.6 -> 2.5.0",
        "six: 1.16.0 -> (none)",
    ]
