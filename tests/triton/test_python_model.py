"""The python-backend model.py returns the outputs a request asks for, and only those."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.triton.conftest import TRITON_MODEL

pytestmark = pytest.mark.integration


def _infer(triton, outputs: list[str] | None) -> dict:
    ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
    inputs = []
    for name in ("input_ids", "attention_mask"):
        tensor = httpclient.InferInput(name, list(ids.shape), "INT64")
        tensor.set_data_from_numpy(ids if name == "input_ids" else np.ones_like(ids))
        inputs.append(tensor)
    requested = [httpclient.InferRequestedOutput(n) for n in outputs] if outputs else None
    with httpclient.InferenceServerClient(triton.http_url) as client:
        result = client.infer(TRITON_MODEL, inputs, outputs=requested)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def test_only_the_requested_output_comes_back(triton, embed_alone):
    got = _infer(triton, ["sentence_embedding"])
    assert list(got) == ["sentence_embedding"]
    want = embed_alone([101, 7592, 2088, 102])
    assert np.max(np.abs(got["sentence_embedding"][0] - want)) <= 1e-5


def test_a_request_naming_no_output_gets_every_output(triton):
    assert sorted(_infer(triton, None)) == ["last_hidden_state", "sentence_embedding"]
