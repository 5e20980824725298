import numpy as np
from ferry.backends.onnxruntime import OnnxRuntimeBackend
from ferry.batcher import TokenSequence, pad_batch


async def test_backend_reads_outputs_and_runs_padded_batches(default_model_dir, embed_alone):
    backend = OnnxRuntimeBackend(default_model_dir / "model.onnx", sessions=2)
    assert not await backend.health()
    await backend.start()
    try:
        assert await backend.health()
        assert backend.output_names == ("last_hidden_state", "sentence_embedding")
        assert backend.sequence_outputs == frozenset({"last_hidden_state"})
        ids = [[101, 2023, 2003, 102], [101, 7592, 102]]
        batch = pad_batch([TokenSequence.from_ids(i) for i in ids])
        outputs = await backend.infer(batch)
        assert outputs["last_hidden_state"].shape == (2, 4, 384)
        for row, item in enumerate(ids):
            assert np.max(np.abs(outputs["sentence_embedding"][row] - embed_alone(item))) <= 1e-5
    finally:
        await backend.close()


async def test_auto_concurrency_measures_and_keeps_the_best_session_count(default_model_dir):
    backend = OnnxRuntimeBackend(default_model_dir / "model.onnx", sessions=0)
    await backend.start()
    try:
        # A real measurement on this machine: at least one session, at most one per core (<= 4).
        assert 1 <= backend.max_concurrency <= 4
        assert backend._idle.qsize() == backend.max_concurrency
    finally:
        await backend.close()
