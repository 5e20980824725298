"""What a peer's /predict answers must be: Ferry's body, and each row what in-process ONNX
Runtime computes for that request alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httpx
import numpy as np


def assert_answers_as_alone(
    inputs: Sequence[list[int]],
    answers: Sequence[httpx.Response],
    model: str,
    embed_alone: Callable[[list[int]], np.ndarray],
) -> None:
    for ids, answer in zip(inputs, answers, strict=True):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["model"] == model
        assert body["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
        # Only the pooled embedding, as Ferry answers /predict.
        assert [list(o) for o in body["outputs"]] == [["sentence_embedding"]]
        got = np.asarray(body["outputs"][0]["sentence_embedding"])
        assert np.max(np.abs(got - embed_alone(ids))) <= 1e-5
