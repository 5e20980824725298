"""The unbatched peer answers /predict with what in-process ONNX Runtime computes."""

from __future__ import annotations

import httpx
import numpy as np
from ferry.bench.unbatched_server import unbatched_server


def test_same_embedding_as_in_process_onnxruntime(default_model_dir, embed_alone):
    inputs = [[101, 7592, 2088, 102], [101, *range(2000, 2060), 102]]
    with unbatched_server(default_model_dir / "model.onnx") as url:
        answers = [
            httpx.post(f"{url}/predict", json={"input_ids": ids}, timeout=30) for ids in inputs
        ]
    for ids, answer in zip(inputs, answers, strict=True):
        assert answer.status_code == 200
        got = np.asarray(answer.json()["outputs"][0]["sentence_embedding"])
        assert np.max(np.abs(got - embed_alone(ids))) <= 1e-5
