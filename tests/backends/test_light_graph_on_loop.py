"""A light graph's small batches run on the event loop's thread, every other batch in a worker
thread (backends/onnx_tensors.py: the handoff to a thread cost the loop more than the run)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from ferry.backends.onnx_graph_ops import read_graph_ops
from ferry.backends.onnx_tensors import ON_LOOP_MAX_BYTES, OnnxTensorBackend
from ferry.backends.options import OnnxRuntimeOptions
from ferry.server.graph_runtime import GraphRuntime
from ferry.server.light_graphs import light_ops
from ferry.server.metrics import FerryMetrics
from ferry.server.settings import ModelSettings
from tests.support.plain_graphs import breast_cancer, breast_cancer_rows

pytestmark = pytest.mark.unit

ROW_BYTES = 30 * 4  # the breast-cancer data's 30 features, FP32
SMALL = 8
LARGE = ON_LOOP_MAX_BYTES // ROW_BYTES + 1


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory):
    path = breast_cancer(tmp_path_factory.mktemp("trees") / "model.onnx", "gradient_boosting")
    # what the server reads before it tells the backend
    assert light_ops(read_graph_ops(path).op_types())
    return path


@pytest.mark.parametrize(
    ("light", "rows", "on_loop"),
    [(True, SMALL, True), (True, LARGE, False), (False, SMALL, False)],
    ids=["light-small", "light-large", "not-light"],
)
async def test_a_light_graphs_small_batch_runs_on_the_loops_thread(trees, light, rows, on_loop):
    backend = OnnxTensorBackend(trees, OnnxRuntimeOptions(device="cpu"))
    await backend.start()
    if light:
        backend.run_small_batches_on_loop()
    threads: list[int] = []
    run = backend._run_on

    def spied(*args):
        threads.append(threading.get_ident())
        return run(*args)

    backend._run_on = spied  # type: ignore[method-assign]
    try:
        x = np.resize(breast_cancer_rows(), (rows, 30))
        names = backend.output_names
        outputs = await backend.run({"X": x}, names)
    finally:
        await backend.close()
    assert len(threads) == 1 and (threads[0] == threading.get_ident()) == on_loop
    # The same answers either way: one session's run, wherever it ran.
    alone = OnnxTensorBackend(trees, OnnxRuntimeOptions(device="cpu"))
    await alone.start()
    try:
        expected = await alone.run({"X": x}, names)
    finally:
        await alone.close()
    for name in names:
        assert np.array_equal(outputs[name], expected[name])


async def test_with_every_session_busy_a_small_batch_waits_in_a_thread_not_on_the_loop(trees):
    backend = OnnxTensorBackend(trees, OnnxRuntimeOptions(device="cpu", sessions=1))
    await backend.start()
    backend.run_small_batches_on_loop()
    try:
        held = backend._sessions.get_nowait()  # as a run in a worker thread holds it
        x = breast_cancer_rows()[:SMALL]
        run = asyncio.create_task(backend.run({"X": x}, backend.output_names))
        await asyncio.sleep(0.05)  # the loop turns: the batch waits elsewhere
        assert not run.done()
        backend._sessions.put(held)
        assert set(await asyncio.wait_for(run, 30)) == set(backend.output_names)
    finally:
        await backend.close()


async def test_the_server_tells_a_light_graphs_backend_from_the_nodes_it_reads(trees):
    settings = ModelSettings(name="trees", path=trees)
    model = GraphRuntime(settings, trees, FerryMetrics(CollectorRegistry()))
    try:
        await model.start()
        assert model.backend._on_loop
    finally:
        await model.close(0)
