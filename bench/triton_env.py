"""Build (once) and describe the private environment that runs a CPU Triton server for tests.

`python -m ferry.bench.triton_env` creates `.venv-triton` beside the project venv. It is separate
because the Triton python backend needs numpy < 2 (with numpy 2 every output tensor comes back
empty), while Ferry itself runs on numpy 2. The Triton 2.51 server binary comes from the
`nvidia-pytriton` wheel, installed without its dependencies: only the binary, its bundled
libraries and the python backend are used, never pytriton's own Python API. Both come from the
locks (`locks/triton.txt`, `locks/triton-nodeps.txt`, hashes checked), which `make lock` writes.

Re-running is cheap: a stamp file holding the locks is compared first.

`TritonLayout` tells a caller (bench/processes.py, deploy/triton/Dockerfile) how to start
`tritonserver` from that venv. Standard library only: the Triton image copies this one file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = ROOT / ".venv-triton"
DEFAULT_LOCKS = ROOT / "locks"
# What the python-backend model (exporters/triton_python_model.py) imports (numpy < 2, above),
# then pytriton's wheel for the server binary, without its requirements.
LOCK, NODEPS_LOCK = "triton.txt", "triton-nodeps.txt"
STAMP = ".ferry-triton-env"


@dataclass(frozen=True)
class TritonLayout:
    """Where the server binary, its backends and its libraries are inside a built venv."""

    venv: Path
    locks: Path = DEFAULT_LOCKS

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        return self.venv / "lib" / version / "site-packages"

    @property
    def server_dir(self) -> Path:
        return self.site_packages / "pytriton" / "tritonserver"

    @property
    def binary(self) -> Path:
        return self.server_dir / "bin" / "tritonserver"

    @property
    def backends_dir(self) -> Path:
        """A backend folder laid out as Triton expects it (python backend + stub for 3.x)."""
        return self.venv / "triton-backends"

    def is_built(self) -> bool:
        stamp = self.venv / STAMP
        stamp_text = _stamp_text(self.locks)
        return stamp.exists() and stamp.read_text() == stamp_text and self.binary.exists()

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment `tritonserver` needs: its libraries first, the venv's python first."""
        env = dict(os.environ if base is None else base)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        # The stub links libpython of the interpreter the venv was made from; the binary links
        # the libraries vendored into the wheel by auditwheel.
        libs = [libdir, str(self.site_packages / "nvidia_pytriton.libs")]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in libs if p)
        # The python backend's stub runs model.py with whatever `python` is first on PATH.
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), env.get("PATH", "")])
        env.pop("PYTHONPATH", None)
        return env

    def command(
        self, model_repository: Path, http_port: int, grpc_port: int, metrics_port: int
    ) -> list[str]:
        return [
            str(self.binary),
            f"--model-repository={model_repository}",
            f"--backend-directory={self.backends_dir}",
            # Loopback only: this is a test and development server.
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
            "--allow-metrics=true",
            # Report per-model counters even without a GPU.
            "--allow-gpu-metrics=false",
            "--log-verbose=0",
            "--exit-timeout-secs=5",
        ]


def _stamp_text(locks: Path) -> str:
    texts = [(locks / name).read_text() for name in (LOCK, NODEPS_LOCK)]
    return "\n".join((*texts, sys.version.split()[0])) + "\n"


def ensure(
    venv: Path = DEFAULT_VENV, quiet: bool = True, locks: Path = DEFAULT_LOCKS
) -> TritonLayout:
    """Create the venv and the backend folder if missing or stale; return where things are."""
    layout = TritonLayout(venv, locks)
    if layout.is_built():
        return layout
    pip_quiet = ["-q"] if quiet else []
    if not layout.python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(layout.python), "-m", "pip", "install", *pip_quiet, "--disable-pip-version-check"]
    # Each lock is complete and hashed: --no-deps so that pip adds nothing it does not name.
    for name in (LOCK, NODEPS_LOCK):
        subprocess.run([*pip, "--no-deps", "--require-hashes", "-r", str(locks / name)], check=True)
    _link_backend(layout)
    (venv / STAMP).write_text(_stamp_text(locks))
    return layout


def _link_backend(layout: TritonLayout) -> None:
    """backends/python/{libtriton_python.so, triton_python_backend_utils.py, stub} via links."""
    python_dir = layout.backends_dir / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = {
        "libtriton_python.so": layout.server_dir / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": layout.server_dir
        / "backends"
        / "python"
        / "triton_python_backend_utils.py",
        "triton_python_backend_stub": layout.server_dir
        / "python_backend_stubs"
        / version
        / "triton_python_backend_stub",
    }
    for name, source in sources.items():
        if not source.exists():
            raise FileNotFoundError(f"{source} is missing from nvidia-pytriton")
        target = python_dir / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--locks", type=Path, default=DEFAULT_LOCKS, help="Folder of the locks.")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    layout = ensure(args.venv, quiet=not args.verbose, locks=args.locks)
    print(f"triton: {layout.binary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
