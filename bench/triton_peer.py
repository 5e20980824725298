"""Triton as a benchmark peer: the CPU python-backend repository, served by a real tritonserver.

Built with the project's Triton tooling (bench/triton_env.py for the server binary,
exporters/triton_repo.py for the repository, bench/processes.py to run it), with
the same batching limits as Ferry's default model: up to 32 per batch, a 2 ms window, and two
model instances of one ONNX Runtime thread each, as Ferry runs two sessions of one thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ferry.bench.processes import TritonProcess, triton_server

TRITON_MODEL = "minilm"
INSTANCES = 2


@contextlib.contextmanager
def triton_peer(model_dir: Path, work_dir: Path) -> Iterator[TritonProcess]:
    """Build (once) the Triton venv, write the repository, start tritonserver; stop it after.

    Anything that keeps Triton from starting raises; the caller decides to skip the peer.
    """
    from ferry.bench.triton_env import ensure
    from ferry.exporters.triton_repo import Batching, write_repository

    layout = ensure()
    repository = work_dir / "triton-repo"
    batching = Batching(instances=INSTANCES)  # Ferry's own batching defaults
    write_repository(model_dir, repository, "python", batching, name=TRITON_MODEL)
    with triton_server(repository, work_dir, layout) as server:
        yield server
