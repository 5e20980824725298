import asyncio
import logging
import re

import numpy as np
import pytest

from ferry.backends.onnxruntime import PROBE_MARGIN, OnnxRuntimeBackend
from ferry.batcher import TokenSequence, pad_batch

pytestmark = pytest.mark.unit


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


async def test_auto_concurrency_measures_and_keeps_the_best_session_count(
    default_model_dir, caplog
):
    caplog.set_level(logging.INFO, logger="ferry.backends.onnxruntime")
    backend = OnnxRuntimeBackend(default_model_dir / "model.onnx", sessions=0)
    await backend.start()
    try:
        # Each count from 1 up was measured, and none beat the one kept by more than the
        # margin (the log rounds rates to 1 seq/s, hence the + 1).
        pattern = r"onnxruntime: (\d+) concurrent sessions: (\d+) seq/s"
        found = [re.match(pattern, r.getMessage()) for r in caplog.records]
        rates = {int(m[1]): float(m[2]) for m in found if m}
        assert sorted(rates) == list(range(1, len(rates) + 1))
        best = backend.max_concurrency
        assert max(rates.values()) <= rates[best] * PROBE_MARGIN + 1, (best, rates)
        # And it serves that many batches at once.
        batch = pad_batch([TokenSequence.from_ids([101, 2023, 102])])
        results = await asyncio.gather(*(backend.infer(batch) for _ in range(best + 2)))
        assert all(r["sentence_embedding"].shape == (1, 384) for r in results)
    finally:
        await backend.close()
