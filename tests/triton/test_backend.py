"""TritonBackend against a real Triton server: metadata, both modes, health and error mapping."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from ferry.backends.errors import BackendRejected, BackendTimeout, BackendUnavailable
from ferry.backends.triton import TritonBackend, TritonTarget, map_error
from ferry.batcher import TokenSequence, pad_batch
from ferry.bench.processes import free_port
from tests.triton.conftest import TRITON_MODEL

pytestmark = pytest.mark.integration

PROTOCOLS = ["http", "grpc"]
TARGET = TritonTarget("127.0.0.1:1", "grpc", "m")


def ragged_batch():
    rng = np.random.default_rng(3)
    lengths = (5, 17, 9)
    ids = [[101, *rng.integers(2000, 29000, n - 2).tolist(), 102] for n in lengths]
    return pad_batch([TokenSequence.from_ids(i) for i in ids])


async def started(triton, protocol: str, mode: str = "batch") -> TritonBackend:
    backend = TritonBackend(
        TritonTarget(triton.url_for(protocol), protocol, TRITON_MODEL), mode=mode, timeout_s=30
    )
    await backend.start()
    return backend


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_start_reads_outputs_and_their_sequence_axis(triton, protocol):
    backend = await started(triton, protocol)
    try:
        assert backend.output_names == ("last_hidden_state", "sentence_embedding")
        assert backend.sequence_outputs == frozenset({"last_hidden_state"})
        assert await backend.health()
    finally:
        await backend.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_batch_and_passthrough_modes_agree_with_onnxruntime(
    triton, protocol, reference_session
):
    batch = ragged_batch()
    feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    names = ("last_hidden_state", "sentence_embedding")
    want = dict(zip(names, reference_session.run(None, feeds), strict=True))
    for mode in ("batch", "passthrough"):
        backend = await started(triton, protocol, mode)
        try:
            got = await backend.infer(batch)
        finally:
            await backend.close()
        assert np.max(np.abs(got["sentence_embedding"] - want["sentence_embedding"])) <= 1e-5
        # Passthrough rows come back unpadded and are re-padded; compare the real tokens only.
        for row, length in enumerate(batch.lengths):
            diff = got["last_hidden_state"][row, :length] - want["last_hidden_state"][row, :length]
            assert np.max(np.abs(diff)) <= 1e-4


async def test_invalid_argument_becomes_backend_rejected(triton):
    backend = await started(triton, "grpc")
    batch = ragged_batch()
    bad = type(batch)(batch.input_ids, batch.attention_mask[:, :3], batch.lengths)
    try:
        with pytest.raises(BackendRejected, match="same shape"):
            await backend.infer(bad)
    finally:
        await backend.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_unreachable_server_is_unhealthy_and_fails_start_as_unavailable(protocol):
    target = TritonTarget(f"127.0.0.1:{free_port()}", protocol, "m")
    backend = TritonBackend(target, start_timeout_s=0.5)
    with pytest.raises(BackendUnavailable, match="not ready after"):
        await backend.start()
    assert not await backend.health()
    await backend.close()


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("StatusCode.UNAVAILABLE", BackendUnavailable),
        ("StatusCode.NOT_FOUND", BackendUnavailable),
        ("503", BackendUnavailable),
        ("StatusCode.INVALID_ARGUMENT", BackendRejected),
        ("400", BackendRejected),
        ("StatusCode.DEADLINE_EXCEEDED", BackendTimeout),
    ],
)
def test_triton_status_maps_to_ferry_error(status, expected):
    mapped = map_error(InferenceServerException("boom", status=status), TARGET)
    assert isinstance(mapped, expected)
    assert "Triton model 'm'" in str(mapped)


def test_model_failure_is_left_for_the_batcher_to_isolate():
    error = InferenceServerException("model raised", status="StatusCode.INTERNAL")
    assert map_error(error, TARGET) is error


def test_settings_map_one_to_one_onto_the_backend():
    from ferry.server.model_runtime import build_backend
    from ferry.server.settings import ModelSettings

    settings = ModelSettings(
        name="m",
        path="/m",
        timeout_s=7,  # a request's deadline: not the call's
        infer_timeout_s=45,
        backend={"kind": "triton", "url": "t:8001", "model": "remote", "concurrency": 5},
        batching={"max_batch_size": 12},
    )
    backend = build_backend(settings)
    assert (backend.target.url, backend.target.model) == ("t:8001", "remote")
    assert (backend.timeout_s, backend.max_concurrency) == (45, 5)
    assert backend.max_batch_size == 12
