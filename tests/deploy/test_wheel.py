"""The built wheel on its own: installed into a fresh venv outside the checkout, it serves the
default model (`ferry serve` + one real /predict) and runs `ferry bench --help`.

The wheel is built from a copy of what pyproject.toml maps (no stale build/ of the checkout) and
installed without dependencies; the venv then finds the dependencies in the dev venv's
site-packages through a plain path line in a .pth file. That adds the folder to sys.path after
the venv's own site-packages without processing the .pth files in it, so the dev venv's editable
`ferry` finder is never installed: every `ferry` module imported is the wheel's.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest

import ferry
from ferry.bench.processes import running
from ferry.bench.server_process import (
    DEFAULT_MODEL_DIR,
    FerryProcess,
    default_model_config,
    write_config,
)
from tests.support.source_trees import parsed

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300


def clean_env() -> dict[str, str]:
    """The environment minus anything that could point Python back at the checkout."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(args: list[str | Path], cwd: Path, timeout_s: float = BUILD_TIMEOUT_S) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{output}"
    return output


def copy_sources(dest: Path) -> None:
    """What the build reads: pyproject.toml, the readme, ferry/ with its symlinks as they are
    (as Docker's COPY keeps them), and the top-level folders they point to."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "ferry", dest / "ferry", symlinks=True, ignore=ignore)
    for link in (REPO / "ferry").iterdir():
        if link.is_symlink():
            folder = link.resolve().relative_to(REPO)
            shutil.copytree(REPO / folder, dest / folder, ignore=ignore)
    for name in ("pyproject.toml", project["project"]["readme"]):
        shutil.copy2(REPO / name, dest / name)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel, and what the build printed."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    copy_sources(source)
    # No build isolation: setuptools comes from the test extra, so this works offline.
    output = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--verbose",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            root / "dist",
            source,
        ],
        cwd=root,
    )
    (wheel,) = (root / "dist").glob("ferry-*.whl")
    return wheel, output


@pytest.fixture(scope="module")
def venv(built: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheel, _ = built
    venv = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent)
    python = venv / "bin" / "python"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-deps",
            "--no-index",
            wheel,
        ],
        cwd=venv.parent,
    )
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], venv)
    dev_site = sysconfig.get_path("purelib")
    Path(site.strip(), "_ferry_test_dependencies.pth").write_text(dev_site + "\n")
    return venv


def test_the_wheel_holds_only_the_ferry_package(built: tuple[Path, str]) -> None:
    wheel, output = built
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"ferry", f"ferry-{ferry.__version__}.dist-info"}, tops
    for module in (
        "server/app.py",
        "server/openai/serving.py",
        "bench/cli.py",
        "llm/ortgenai.py",
        "exporters/triton_python_model.py",
        "batcher/batcher.py",
    ):
        assert f"ferry/{module}" in names
    # A deprecation in the packaging metadata (e.g. project.license as a table) fails here first.
    assert "deprecat" not in output.lower(), output


def imported_modules(source: bytes) -> list[tuple[int, str]]:
    """(line, module) for every absolute import in a Python source."""
    found = []
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_shipped_code_imports_neither_tests_nor_tools(built: tuple[Path, str]) -> None:
    """Not even lazily (inside a function): neither package is in the wheel."""
    wheel, _ = built
    offenders = []
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py"):
                for line, module in imported_modules(archive.read(name)):
                    if module.split(".")[0] in {"tests", "tools"}:
                        offenders.append(f"{name}:{line} imports {module}")
    assert not offenders, offenders


def test_imports_come_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    code = (
        "import ferry, ferry.server.app, ferry.bench.cli, ferry.llm.ortgenai, sys\n"
        "print(ferry.__file__); print(ferry.server.app.__file__)\n"
        "print(ferry.bench.cli.__file__); print(ferry.llm.ortgenai.__file__)\n"
        "print('tests' in sys.modules or 'tools' in sys.modules)"
    )
    *files, imported_tests = run([venv / "bin" / "python", "-c", code], tmp_path).split()
    for file in files:
        assert Path(file).is_relative_to(venv), file
        assert not Path(file).is_relative_to(REPO), file
    assert imported_tests == "False"


def test_ferry_serve_from_the_wheel_answers_predict(
    venv: Path, tmp_path: Path, embed_alone
) -> None:
    assert DEFAULT_MODEL_DIR.is_absolute()
    config = write_config(tmp_path / "ferry.toml", [default_model_config()])
    ferry = [str(venv / "bin" / "ferry")]
    handle = FerryProcess(config, tmp_path / "server.log", launcher=ferry, cwd=tmp_path)
    handle.env = clean_env()  # nothing that points Python back at the checkout
    with running(handle, timeout_s=120):
        ids = [101, 7592, 2088, 102]  # [CLS] hello world [SEP]
        response = httpx.post(f"{handle.url}/predict", json={"input_ids": ids}, timeout=60)
        assert response.status_code == 200, response.text
        got = np.asarray(response.json()["outputs"][0]["sentence_embedding"])
        assert np.max(np.abs(got - embed_alone(ids))) <= 1e-5
    assert handle.process is not None and handle.process.returncode == 0, handle.log()


def test_ferry_bench_help_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    output = run([venv / "bin" / "ferry", "bench", "--help"], tmp_path, timeout_s=120)
    assert "--concurrency" in output and "--protocol" in output
