"""The unbatched peer answers /predict like Ferry, with what in-process ONNX Runtime computes."""

from __future__ import annotations

import httpx
import numpy as np

from ferry.bench.unbatched_server import unbatched_server


def test_same_embedding_and_shape_as_ferry(default_model_dir, embed_alone):
    inputs = [[101, 7592, 2088, 102], [101, *range(2000, 2060), 102]]
    with unbatched_server(default_model_dir / "model.onnx", sessions=2) as server:
        answers = [
            httpx.post(f"{server.url}/predict", json={"input_ids": ids}, timeout=30)
            for ids in inputs
        ]
        bad = httpx.post(f"{server.url}/predict", json={"input_ids": []}, timeout=30)
    for ids, answer in zip(inputs, answers, strict=True):
        assert answer.status_code == 200
        body = answer.json()
        assert body["model"] == default_model_dir.name
        assert body["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
        # Only the pooled embedding, as Ferry answers /predict.
        assert [list(o) for o in body["outputs"]] == [["sentence_embedding"]]
        got = np.asarray(body["outputs"][0]["sentence_embedding"])
        assert np.max(np.abs(got - embed_alone(ids))) <= 1e-5
    assert bad.status_code == 422 and "input_ids" in bad.text
