"""The encoder path's one validation boundary (server/encoder_validation.py) on the real default
model: every rule a request must pass, the field each refusal names in each protocol's words,
and what a valid request becomes (padded tensors stay padded, rows are views)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ferry.bench.server_process import default_model_config
from ferry.server.encoder_request import Texts, TokenArrays, TokenLists, ValidSequences
from ferry.server.encoder_validation import EncoderValidation
from ferry.server.errors import InvalidInput
from ferry.server.settings import Settings

pytestmark = [pytest.mark.unit, pytest.mark.asyncio(loop_scope="session")]

EMBEDDING = ("sentence_embedding",)
MAX_LENGTH, VOCAB = 256, 30522  # all-MiniLM-L6-v2's manifest
LIMITS = dict(max_items_per_request=3, max_chars_per_text=50, max_tokens_per_request=300)
VALIDATION = EncoderValidation(Settings(models=[default_model_config()], **LIMITS))


async def refusal(runtime, inputs, outputs=EMBEDDING, timeout_s=None) -> tuple[str, str]:
    with pytest.raises(InvalidInput) as info:
        await VALIDATION.validate(runtime, inputs, outputs, timeout_s)
    return info.value.field, info.value.message


def lists(ids, mask=None, field="input_ids") -> TokenLists:
    return TokenLists(ids, mask, field)


@pytest.mark.parametrize(
    ("ids", "mask", "field", "message"),
    [
        ([[]], None, "input_ids", "input_ids must be a non-empty list of token ids"),
        ([[1] * 257], None, "input_ids", "sequence has 257 tokens; this model takes at most 256"),
        ([[1, 2]], [[1]], "attention_mask", "attention_mask has 1 values but input_ids has 2"),
        ([[1, 2]], [[1], [1]], "attention_mask", "attention_mask has 2 items but input_ids has 1"),
        (
            [[1, VOCAB]],
            None,
            "input_ids",
            f"token id {VOCAB} is outside the vocabulary [0, {VOCAB})",
        ),
        ([[-1, 2]], None, "input_ids", f"token id -1 is outside the vocabulary [0, {VOCAB})"),
        ([[1, 2]], [[1, 2]], "attention_mask", "attention_mask values must be 0 or 1"),
        ([[1, 2]], [[-1, 1]], "attention_mask", "attention_mask values must be 0 or 1"),
        ([[1, 2]], [[0, 0]], "attention_mask", "attention_mask must keep at least one token"),
        ([[2**64]], None, "input_ids", "token ids must be integers in [0, 2**63)"),
        ([[1]], [[2**64]], "attention_mask", "attention_mask values must be 0 or 1"),
        ([[1]], [["x"]], "attention_mask", "attention_mask values must be 0 or 1"),
        ([], None, "input_ids", "the input list is empty"),
        ([[1]] * 4, None, "input_ids", "4 items; at most 3 per request"),
        ([[1] * 200, [1] * 200], None, "input_ids", "400 tokens; at most 300 per request"),
    ],
)
async def test_each_rule_names_its_field_and_says_why(runtime, ids, mask, field, message):
    assert await refusal(runtime, lists(ids, mask)) == (field, message)


async def test_more_items_than_the_model_s_queue_holds_are_invalid_not_a_429(runtime, monkeypatch):
    # A 429 would tell the client to retry what can never be queued (all items or none).
    # Nor more than half of it (issue 48): the other half stays for other clients.
    small_queue = replace(runtime.settings.batching, max_queue_size=4)
    monkeypatch.setattr(
        runtime, "settings", runtime.settings.model_copy(update={"batching": small_queue})
    )
    assert await refusal(runtime, lists([[101, 102]] * 3)) == (
        "input_ids",
        "3 items; one request may take at most 2 of this model's 4 queue places",
    )
    assert (
        len((await VALIDATION.validate(runtime, lists([[101, 102]] * 2), EMBEDDING)).lengths) == 2
    )


async def test_an_item_is_named_by_its_index_in_the_routes_own_words(runtime):
    ok = [101, 102]
    assert (await refusal(runtime, lists([ok, [1, VOCAB]], field="input")))[0] == "input[1]"
    assert (await refusal(runtime, lists([ok, ok], [[1, 1], [0, 0]])))[0] == "attention_mask[1]"
    assert (await refusal(runtime, Texts(["ok", " "], "text")))[0] == "text[1]"
    assert await refusal(runtime, Texts(["ok", "x" * 51], "inputs")) == (
        "inputs[1]",
        "text has 51 characters; at most 50",
    )


async def test_long_texts_are_refused_unless_truncated(runtime):
    roomy = EncoderValidation(Settings(models=[default_model_config()]))
    long = Texts(["word " * 300], "inputs")
    with pytest.raises(InvalidInput) as info:
        await roomy.validate(runtime, long, EMBEDDING)
    assert (info.value.field, info.value.message) == (
        "inputs",
        "text is 302 tokens long; this model takes at most 256 (send truncate=true to cut it)",
    )
    cut = Texts(long.texts, "inputs", truncate=True)
    assert (await roomy.validate(runtime, cut, EMBEDDING)).lengths == (MAX_LENGTH,)


async def test_a_valid_request_carries_everything_downstream_needs(runtime):
    valid = await VALIDATION.validate(
        runtime, lists([[101, 7592, 102], [101, 102]], [[1, 1, 1], [1, 1]]), EMBEDDING, 2.0, -3
    )
    assert valid == ValidSequences(
        runtime.name,
        valid.input_ids,
        valid.attention_mask,
        (3, 2),
        5,
        EMBEDDING,
        "input_ids",
        2.0,
        -3,
    )
    assert valid.input_ids.tolist() == [[101, 7592, 102], [101, 102, 0]]
    assert valid.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert (valid.count, valid.width, valid.item(1)) == (2, 3, "input_ids[1]")
    rows = valid.sequences()
    assert [r.length for r in rows] == [3, 2] and rows[1].input_ids.base is not None  # views


async def test_padded_tensors_stay_padded_and_their_padding_is_not_checked(runtime):
    ids = np.array([[101, 5, 102, 0], [101, 5, 7, 102], [101, 9, 102, -7]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 0]], dtype=np.int64)
    valid = await VALIDATION.validate(runtime, TokenArrays(ids, mask), EMBEDDING)
    assert valid.input_ids is ids and valid.attention_mask is mask  # no copy, no re-padding
    assert valid.lengths == (3, 4, 3)  # cut after the last 1: a hole is not the end
    assert valid.tokens == 10
    mask[1] = 0  # an all-zero row is kept whole so that the refusal names it
    assert await refusal(runtime, TokenArrays(ids, mask)) == (
        "attention_mask[1]",
        "attention_mask must keep at least one token",
    )


async def test_the_answer_size_and_the_deadline_are_bounded_before_queueing(runtime):
    small = EncoderValidation(Settings(models=[default_model_config()], max_response_bytes=1024))
    with pytest.raises(InvalidInput) as info:
        await small.validate(runtime, lists([[101, 102]] * 2), ("last_hidden_state",))
    assert info.value.field == "outputs" and "per response" in info.value.message
    field, message = await refusal(runtime, lists([[101] * 256]), timeout_s=1e-6)
    assert field == "timeout_ms" and "cannot be met" in message


async def test_refusals_are_counted_as_invalid_rejections(runtime):
    counter = runtime._metrics.rejections.labels(runtime.name, "invalid")
    before = counter._value.get()
    await refusal(runtime, lists([[1, VOCAB]]))
    await VALIDATION.validate(runtime, lists([[101, 102]]), EMBEDDING)
    assert counter._value.get() == before + 1
