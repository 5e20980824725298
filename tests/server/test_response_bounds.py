"""Issue 48: what one answer may make the server write is bounded before it is written. A plain
graph answering 1000x its request is refused past `max_response_bytes`, naming the output, and
Triton's top-k classification is bounded in k x rows, before the graph runs."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from ferry.bench.server_process import ferry_server
from tests.server.conftest import IN_PROCESS
from tests.support import plain_graphs

pytestmark = pytest.mark.integration

MAX_RESPONSE_BYTES = 2**20


# The bound is checked in the API process, on the engine's rows as they come back.
@pytest.fixture(scope="module", params=IN_PROCESS)
def server(request, tmp_path_factory):
    graph = plain_graphs.tiled(tmp_path_factory.mktemp("tiled") / "tiled.onnx")
    options = {"api_servers": request.param, "max_response_bytes": MAX_RESPONSE_BYTES}
    with ferry_server([{"name": "tiled", "path": str(graph)}], options) as handle:
        yield handle


def rows(count: int) -> list[list[float]]:
    return np.arange(count * 4, dtype=np.float32).reshape(count, 4).tolist()


def kserve(server, count: int, classification: int | None = None) -> httpx.Response:
    data = np.ravel(rows(count)).tolist()
    body: dict = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [count, 4], "data": data}]}
    if classification is not None:
        body["outputs"] = [{"name": "y", "parameters": {"classification": classification}}]
    return httpx.post(f"{server.url}/v2/models/tiled/infer", json=body, timeout=60)


def predict(server, count: int) -> httpx.Response:
    body = {"model": "tiled", "inputs": {"x": rows(count)}}
    return httpx.post(f"{server.url}/predict", json=body, timeout=60)


def refused_param(answer: httpx.Response) -> str:
    error = answer.json()["error"]
    return error.split(":")[0] if isinstance(error, str) else error["param"]


@pytest.mark.parametrize("send", [kserve, predict], ids=["kserve", "predict"])
def test_an_answer_past_max_response_bytes_is_refused_naming_the_output(server, send):
    # 100 rows of 4,000 floats: ~5.6 MB of JSON, past the 1 MiB bound.
    answer = send(server, 100)
    assert 400 <= answer.status_code < 500, answer.text[:300]
    assert refused_param(answer) == "y"
    assert "max_response_bytes" in answer.text
    # Under the bound (2 rows: ~110 KB) it is served.
    served = send(server, 2)
    assert served.status_code == 200, served.text[:300]


@pytest.mark.parametrize(("k", "count", "served"), [(1000, 100, False), (10, 100, True)])
def test_top_k_times_rows_is_bounded_before_the_run(server, k, count, served):
    answer = kserve(server, count, classification=k)
    if served:
        assert answer.status_code == 200, answer.text[:300]
        (output,) = answer.json()["outputs"]
        assert output["datatype"] == "BYTES" and output["shape"] == [count, k]
    else:
        assert answer.status_code == 400, answer.text[:300]
        assert refused_param(answer) == "y" and "at most 65536" in answer.text
