"""Triton as a benchmark peer: the CPU python-backend repository, served by a real tritonserver.

Built with the project's Triton tooling (tools/triton_env.py for the server binary,
exporters/triton_repo.py for the repository, tests/triton/triton_process.py to run it), with
the same batching limits as Ferry's default model: up to 32 per batch, a 2 ms window, and two
model instances of one ONNX Runtime thread each, as Ferry runs two sessions of one thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.triton.triton_process import TritonProcess

TRITON_MODEL = "minilm"
INSTANCES = 2


@contextlib.contextmanager
def triton_peer(model_dir: Path, work_dir: Path) -> Iterator[TritonProcess]:
    """Build (once) the Triton venv, write the repository, start tritonserver; stop it after.

    Anything that keeps Triton from starting raises; the caller decides to skip the peer.
    """
    from ferry.exporters.triton_repo import Batching, write_repository
    from tests.triton.triton_process import triton_server
    from tools.triton_env import ensure

    layout = ensure()
    repository = work_dir / "triton-repo"
    batching = Batching(instances=INSTANCES)  # Ferry's own batching defaults
    write_repository(model_dir, repository, "python", batching, name=TRITON_MODEL)
    with triton_server(layout, repository, work_dir) as server:
        yield server
