"""EncoderServing (server/encoder.py) on the real default model, started in this process:
validate once, then run: one row per item in order, the usage from the validated value, and
the queued rows dropped when the client leaves."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ferry.bench.server_process import default_model_config
from ferry.server.disconnect import ClientDisconnected
from ferry.server.encoder import EncoderServing
from ferry.server.encoder_request import Texts, TokenLists
from ferry.server.settings import Settings

pytestmark = [pytest.mark.unit, pytest.mark.asyncio(loop_scope="session")]

EMBEDDING = ("sentence_embedding",)
ENCODER = EncoderServing(Settings(models=[default_model_config()]))


async def test_rows_come_back_in_order_with_the_validated_token_count(runtime, embed_alone):
    items = [[101, *range(2000, 2000 + n), 102] for n in (30, 1, 12)]
    valid = await ENCODER.validate(runtime, TokenLists(items, None, "input_ids"), EMBEDDING)
    result = await ENCODER.run(runtime, valid)
    assert result.prompt_tokens == valid.tokens == sum(map(len, items))
    for ids, row in zip(items, result.rows, strict=True):
        assert np.max(np.abs(row["sentence_embedding"] - embed_alone(ids))) <= 1e-5


async def test_texts_are_tokenized_once_and_run_like_their_ids(runtime):
    texts = Texts(["the quick brown fox", "jumps"], "inputs")
    valid = await ENCODER.validate(runtime, texts, EMBEDDING)
    ids = [valid.input_ids[i, :n].tolist() for i, n in enumerate(valid.lengths)]
    by_text = await ENCODER.run(runtime, valid)
    by_ids = await ENCODER.run(
        runtime, await ENCODER.validate(runtime, TokenLists(ids, None, "input_ids"), EMBEDDING)
    )
    for a, b in zip(by_text.rows, by_ids.rows, strict=True):
        assert np.array_equal(a["sentence_embedding"], b["sentence_embedding"])


async def test_a_client_that_left_gets_client_disconnected_and_its_rows_are_dropped(runtime):
    valid = await ENCODER.validate(
        runtime, TokenLists([[101, 102]] * 3, None, "input_ids"), EMBEDDING
    )
    left = asyncio.get_running_loop().create_future()
    left.set_result(None)  # gone before its rows could run
    with pytest.raises(ClientDisconnected):
        await ENCODER.run(runtime, valid, left)
    assert runtime.batcher.queue_depth == 0
