"""The decoder on onnxruntime's InferenceSession (ortgenai_kv.py), on the real SmolLM2-135M int4:
one row gives og.Generator's tokens; in a step of two or more rows a row's logits do not depend
on the others; prompts in pieces land in their row."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import onnxruntime_genai as og
import pytest

from ferry.llm.ortgenai_kv import KVBlock, KVModel
from tests.llm.llm_paths import REAL_MODEL
from tests.llm.reference_og import eos_ids, greedy

pytestmark = pytest.mark.unit


def fill(model: KVModel, block: KVBlock, row: int, prompt: list[int], piece: int) -> int:
    """The prompt into `row` in pieces of `piece` tokens; its greedy first token."""
    done = 0
    while done < len(prompt):
        logits = model.prefill(block, row, done, prompt[done : done + piece])
        done = min(done + piece, len(prompt))
    return int(logits.argmax())


def decode_greedy(model: KVModel, prompts: list[list[int]], steps: int) -> np.ndarray:
    """Every prompt in its own row, then `steps` greedy decode steps of all rows together:
    [rows, steps] logits rows' argmax and the last step's logits."""
    block = model.new_block(len(prompts), 128)
    tokens = np.array([fill(model, block, r, p, 8) for r, p in enumerate(prompts)])
    lengths = np.array([len(p) for p in prompts])
    chosen = [tokens.copy()]
    for _ in range(steps):
        logits = model.decode(block, len(prompts), lengths, tokens)
        lengths += 1
        tokens = logits.argmax(-1)
        chosen.append(tokens.copy())
    return np.stack(chosen, axis=1)


def test_one_row_gives_the_og_generator_tokens(kv_model, prompts):
    stop = eos_ids(REAL_MODEL)
    expected, _ = greedy(og.Model(str(REAL_MODEL)), prompts[0], 12, stop)
    got = decode_greedy(kv_model, prompts[:1], 11)[0].tolist()
    # The Generator stops before an end-of-sequence token; the raw decode goes on past it.
    assert got[: len(expected)] == expected
    assert len(expected) == len(got) or got[len(expected)] in stop


def test_in_a_step_of_several_rows_a_row_does_not_depend_on_the_others(kv_model, prompts):
    together = decode_greedy(kv_model, prompts, 10)  # three rows of different lengths
    for row, prompt in enumerate(prompts):
        partner = prompts[(row + 1) % len(prompts)]
        pair = decode_greedy(kv_model, [partner, prompt], 10)
        assert pair[1].tolist() == together[row].tolist()


def test_a_prompt_in_pieces_fills_its_row_as_in_one_piece(kv_model, prompts):
    whole, pieces = kv_model.new_block(2, 64), kv_model.new_block(2, 64)
    first = fill(kv_model, whole, 1, prompts[0], len(prompts[0]))
    assert fill(kv_model, pieces, 1, prompts[0], 5) == first
    used = len(prompts[0])
    assert np.array_equal(whole.keys[:, 1, :, :used], pieces.keys[:, 1, :, :used])
    assert not pieces.keys[:, 0].any()  # the other row is untouched


@pytest.mark.parametrize("mapped", [False, True])
def test_a_cached_decode_binding_keeps_its_block_alive(kv_model, prompts, mapped):
    # The binding points into the block's memory but holds no block: a mapped block's arrays
    # died under it, and a later block whose array took the same id() decoded through the stale
    # binding, from another block's keys and values (CI saw garbage from the second token on).
    block = kv_model.new_block(1, 64, mapped=mapped)
    token = fill(kv_model, block, 0, prompts[0], 8)
    kv_model.decode(block, 1, np.array([len(prompts[0])]), np.array([token]))
    keys = weakref.ref(block.keys)
    del block
    gc.collect()
    assert keys() is not None
    kv_model.forget_bindings()
    gc.collect()
    assert keys() is None


def test_copy_row_moves_the_first_tokens_only(kv_model):
    source, target = kv_model.new_block(1, 8), kv_model.new_block(2, 16)
    source.keys[:] = 1.0
    source.values[:] = 2.0
    target.copy_row(source, 0, 1, 5)
    assert target.keys[:, 1, :, :5].min() == 1.0 and not target.keys[:, 1, :, 5:].any()
    assert target.values[:, 1, :, :5].max() == 2.0 and not target.keys[:, 0].any()
    assert kv_model.token_bytes == 30 * 2 * 3 * 64 * 4


def test_a_session_whose_threads_spin_decodes_the_same_tokens(kv_model, prompts):
    # bench.llm_int4 compares spinning pools against Ferry's sleeping ones on the same steps.
    spinning = KVModel(REAL_MODEL, 2, spin_us=200)
    assert (
        decode_greedy(spinning, prompts, 6).tolist() == decode_greedy(kv_model, prompts, 6).tolist()
    )
