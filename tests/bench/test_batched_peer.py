"""The LitServe and Mosec peers batch, pad and unpad right: each row of a real padded batch is
what in-process ONNX Runtime computes for that request alone, in Ferry's /predict answer."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ferry.bench.batched_peer import _kill_survivors, _running, _started, batched_peer
from ferry.bench.process_cpu import process_tree
from tests.support.predict_answers import assert_answers_as_alone

pytestmark = pytest.mark.integration

PEERS = ["ferry.bench.litserve_server", "ferry.bench.mosec_server"]
# A batch of two that waits long for its second request: two sent at once are one batch.
PAIR, LONG_WAIT_MS = 2, 1000


@pytest.mark.parametrize("module", PEERS)
def test_each_row_of_a_padded_batch_equals_its_request_run_alone(
    module, default_model_dir, embed_alone
):
    short, long = [101, 7592, 2088, 102], [101, *range(2000, 2060), 102]
    model = default_model_dir / "model.onnx"
    with batched_peer(module, model, max_batch_size=PAIR, wait_ms=LONG_WAIT_MS) as server:

        def post(body: dict) -> httpx.Response:
            return httpx.post(f"{server.url}/predict", json=body, timeout=30)

        with ThreadPoolExecutor(PAIR) as pool:
            answers = list(pool.map(post, [{"input_ids": short}, {"input_ids": long}]))
        bad = post({"input_ids": []})
        tree = process_tree(server.pid)
    assert len(tree) >= 3  # HTTP front, worker, ... : each one ends with the server
    assert not [pid for pid in tree if _running(pid)]
    # The short row was padded by 58 tokens: unmasked, they would move it far past 1e-5.
    assert_answers_as_alone([short, long], answers, default_model_dir.name, embed_alone)
    assert bad.status_code == 422 and "input_ids" in bad.text


def test_a_survivor_is_killed_only_if_its_pid_was_not_reused():
    child = subprocess.Popen(["sleep", "60"])
    try:
        _kill_survivors({child.pid: "1"})  # another process that once had this pid
        assert child.poll() is None
        _kill_survivors({child.pid: _started(child.pid)})
        assert child.wait(10) == -9
    finally:
        child.kill()
        child.wait(10)
