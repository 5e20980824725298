"""The unbatched peer answers /predict like Ferry, with what in-process ONNX Runtime computes."""

from __future__ import annotations

import httpx
import pytest

from ferry.bench.unbatched_server import unbatched_server
from tests.support.predict_answers import assert_answers_as_alone

pytestmark = pytest.mark.integration


def test_same_embedding_and_shape_as_ferry(default_model_dir, embed_alone):
    inputs = [[101, 7592, 2088, 102], [101, *range(2000, 2060), 102]]
    with unbatched_server(default_model_dir / "model.onnx", sessions=2) as server:
        answers = [
            httpx.post(f"{server.url}/predict", json={"input_ids": ids}, timeout=30)
            for ids in inputs
        ]
        bad = httpx.post(f"{server.url}/predict", json={"input_ids": []}, timeout=30)
    assert_answers_as_alone(inputs, answers, default_model_dir.name, embed_alone)
    assert bad.status_code == 422 and "input_ids" in bad.text
