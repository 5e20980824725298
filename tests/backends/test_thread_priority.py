"""Worker threads run nicer than the event loop (backends/thread_priority.py)."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ferry.backends.thread_priority import lower_this_thread

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(sys.platform != "linux", reason="nice is per thread on Linux"),
]


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize("niceness", [0, 3])
def test_a_pool_thread_runs_nicer_and_the_caller_does_not(niceness):
    before = _niceness()
    with ThreadPoolExecutor(1, initializer=lower_this_thread, initargs=(niceness,)) as pool:
        worker = pool.submit(_niceness).result()
    assert worker == min(19, before + niceness)
    assert _niceness() == before


def test_threads_a_lowered_thread_starts_inherit_its_niceness():
    before = _niceness()

    def child_niceness() -> int:
        seen: list[int] = []
        child = threading.Thread(target=lambda: seen.append(_niceness()))
        child.start()
        child.join()
        return seen[0]

    with ThreadPoolExecutor(1, initializer=lower_this_thread, initargs=(2,)) as pool:
        assert pool.submit(child_niceness).result() == min(19, before + 2)


@pytest.mark.parametrize("niceness", [0, 4])
async def test_a_plain_graphs_inference_threads_run_nicer(tmp_path, niceness):
    from ferry.backends.onnx_tensors import OnnxTensorBackend
    from ferry.backends.options import OnnxRuntimeOptions
    from tests.support.plain_graphs import masked_mean

    options = OnnxRuntimeOptions(device="cpu", sessions=1, worker_niceness=niceness)
    backend = OnnxTensorBackend(masked_mean(tmp_path / "masked.onnx"), options)
    await backend.start()
    try:
        worker = backend._executor.submit(_niceness).result()  # the thread that runs the graph
    finally:
        await backend.close()
    assert worker == min(19, _niceness() + niceness)
