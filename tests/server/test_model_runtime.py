"""ModelRuntime (server/model_runtime.py) on the real default model, started in this process:
the one check of output names, what it learns at start, the deadline floor, and submitting a
validated request."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from ferry.bench.server_process import default_model_config
from ferry.server.encoder_request import ValidSequences
from ferry.server.errors import InvalidInput
from ferry.server.metrics import FerryMetrics
from ferry.server.model_runtime import ModelRuntime
from ferry.server.settings import Settings

pytestmark = [pytest.mark.unit, pytest.mark.asyncio(loop_scope="session")]

HIDDEN, EMBEDDING = "last_hidden_state", "sentence_embedding"


async def test_outputs_are_the_named_ones_else_the_configured_ones(runtime):
    assert runtime.outputs.select(None) == (EMBEDDING,)  # the configured default
    assert runtime.outputs.select([HIDDEN, EMBEDDING]) == (HIDDEN, EMBEDDING)
    # KServe: every tensor the backend has, by default.
    assert runtime.outputs.select([], tensors=True) == (HIDDEN, EMBEDDING)
    for requested, tensors in (["nope"], False), ([None], True), (["label"], True):
        with pytest.raises(InvalidInput) as info:
            runtime.outputs.select(requested, tensors=tensors)
        assert info.value.field == "outputs" and "choose from" in info.value.message


async def test_derived_outputs_are_fetched_as_logits(runtime):
    assert runtime.outputs.for_backend(["label", "probabilities", HIDDEN]) == {"logits", HIDDEN}


async def test_widths_and_sequence_outputs_are_learned_at_start(runtime):
    assert runtime.ready
    # ONNX Runtime queues batches in its own worker pool: the batcher forms one ahead.
    limits = runtime.batcher.limits
    assert limits.max_concurrent_batches == runtime.backend.max_concurrency
    assert limits.prepared_batches == 1
    assert runtime.outputs.width(EMBEDDING) == runtime.outputs.width(HIDDEN) == 384
    assert runtime.outputs.is_sequence(HIDDEN) and not runtime.outputs.is_sequence(EMBEDDING)


async def test_a_deadline_under_half_the_idle_time_of_the_longest_row_is_refused(runtime):
    longest = runtime.manifest.max_length
    one_row_s = runtime.batcher.cost_model.fastest(1, longest)
    runtime.check_deadline(longest, one_row_s * 0.6)  # tight, but possible
    with pytest.raises(InvalidInput) as info:
        runtime.check_deadline(longest, one_row_s * 0.4)
    assert info.value.field == "timeout_ms" and f"{longest} tokens" in info.value.message


async def test_submit_queues_each_row_and_resolves_with_the_wanted_outputs(runtime, embed_alone):
    ids = np.array([[101, 7592, 102, 0], [101, 2023, 2003, 102]], dtype=np.int64)
    mask = (ids != 0).astype(np.int64)
    valid = ValidSequences(runtime.name, ids, mask, (3, 4), 7, (EMBEDDING,), "input_ids")
    rows = await asyncio.gather(*runtime.submit(valid))
    for index, (row, length) in enumerate(zip(rows, valid.lengths, strict=True)):
        assert set(row) == {EMBEDDING}  # only what was asked for is copied out
        want = embed_alone(ids[index, :length].tolist())  # the padding never reached the model
        assert np.max(np.abs(row[EMBEDDING] - want)) <= 1e-5
    rendered = runtime.outputs.render(rows[0], (EMBEDDING,))
    assert list(rendered) == [EMBEDDING]
    assert np.array_equal(rendered[EMBEDDING], rows[0][EMBEDDING])


async def test_a_folder_without_a_manifest_or_config_names_the_files_looked_for(tmp_path):
    config = default_model_config(name="empty", path=str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        ModelRuntime(Settings(models=[config]).models[0], FerryMetrics())
    assert str(tmp_path) in str(info.value)
    assert "ferry_model.json" in str(info.value) and "config.json" in str(info.value)


@pytest.mark.parametrize("missing", ["tokenizer.json", "model.onnx"])
async def test_a_missing_model_file_is_named(default_model_dir, tmp_path, missing):
    for name in ("ferry_model.json", "tokenizer.json", "model.onnx"):
        if name != missing:
            (tmp_path / name).symlink_to(default_model_dir / name)
    config = default_model_config(name="partial", path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / missing))):
        ModelRuntime(Settings(models=[config]).models[0], FerryMetrics())
