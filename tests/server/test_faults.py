"""The fault guarantees over HTTP, on the real server process running a real (tiny, faulty) ONNX
model (tests/server/faulty_model.py): a hung backend answers 504 and the next request is served;
a batch that fails fails only its culprit, the others get the result they get alone."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from ferry.bench.server_process import DEFAULT_MODEL_DIR, ferry_server
from tests.server import faulty_model
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

NAME = "faulty"
INFER_TIMEOUT_S = 0.5  # a normal batch of this model takes about a millisecond


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = faulty_model.build(
        tmp_path_factory.mktemp("faulty") / NAME, DEFAULT_MODEL_DIR / "tokenizer.json"
    )
    config = {
        "name": NAME,
        "path": str(folder),
        "infer_timeout_s": INFER_TIMEOUT_S,
        # Its slow token stalls the whole batch (a ReduceMax over every row), which Ferry finds
        # and would serve one request at a time: the batch is what these tests are about.
        "accept_neighbour_dependence": True,
        "backend": {"kind": "onnxruntime", "sessions": 2},
        # Hold each batch open long enough that concurrent requests share it. The fairness
        # window is off: it would close the batch to requests arriving more than about half a
        # (millisecond) batch apart, which a busy box can spread them by.
        "batching": {
            "dispatch_when_idle": False,
            "max_queue_delay_s": 1.0,
            "cost_model_batching": False,
            "fairness_window": "none",  # TOML has no null
        },
    }
    with ferry_server([config]) as handle:
        yield handle


def predict(server, ids: list[int]) -> httpx.Response:
    return httpx.post(f"{server.url}/predict", json={"model": NAME, "input_ids": ids}, timeout=30)


def test_a_hung_backend_answers_504_and_the_next_request_is_served(server):
    hung = predict(server, [5, faulty_model.SLOW])
    assert hung.status_code == 504, hung.text
    assert hung.json()["error"]["type"] == "timeout_error"
    assert f"within {INFER_TIMEOUT_S}s" in hung.json()["error"]["message"]
    # The stuck run still holds a session; the next request is served by the other one.
    after = predict(server, [1, 2, 3])
    assert after.status_code == 200, after.text
    (row,) = after.json()["outputs"]
    assert row["sentence_embedding"] == pytest.approx(faulty_model.expected_embedding([1, 2, 3]))


def test_a_failing_batch_fails_only_its_culprit(server):
    before = server.metrics()
    inputs = [[1, 2], [3, 500, 4], [7]]  # token 500 is past the model's table

    async def send_together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await asyncio.gather(
                *(client.post("/predict", json={"model": NAME, "input_ids": ids}) for ids in inputs)
            )

    good_a, bad, good_b = asyncio.run(send_together())
    assert bad.status_code == 500
    assert bad.json()["error"]["type"] == "internal_error"
    assert "out of data bounds" in bad.json()["error"]["message"]
    for response, ids in ((good_a, inputs[0]), (good_b, inputs[2])):
        assert response.status_code == 200, response.text
        (row,) = response.json()["outputs"]
        assert row["sentence_embedding"] == pytest.approx(faulty_model.expected_embedding(ids))
    after = server.metrics()

    def batches(text: str, suffix: str) -> float:
        return metric_value(text, f"ferry_batch_size_requests_{suffix}", model=NAME)

    # One batch of three, then each member alone: four batches, six places.
    assert batches(after, "count") - batches(before, "count") == 4
    assert batches(after, "sum") - batches(before, "sum") == 6
