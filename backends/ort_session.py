"""ONNX Runtime session options as Ferry sets them everywhere: the backend, the peers, the tools.

Threads are set per session (Ferry runs several sessions side by side, each with few threads);
inter-op threads matter only in parallel execution mode, which Ferry never uses, so one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def session_options(threads: int, spinning: bool | None = None) -> Any:
    """`threads` intra-op threads, every graph optimisation; `spinning` None: ORT's default."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if spinning is not None:
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if spinning else "0"
        )
    if spinning:
        # Spin while a run is on (fast hand-offs between ops), not after it: threads left
        # spinning between runs take the cores from the event loop and the other sessions.
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


def cpu_session(model: Path, threads: int) -> Any:
    """An InferenceSession of `model` on the CPU execution provider."""
    import onnxruntime as ort

    options = session_options(threads)
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
