"""The default chat model is the same model on every machine: the one `make model` built matches
the committed fingerprint, and a model that differs is named by prompt, token and file."""

from __future__ import annotations

import copy
import json

import pytest

from ferry.exporters.default_llm import (
    AGREED_TOKENS,
    FINGERPRINT_FILE,
    FINGERPRINT_PROMPTS,
    fingerprint,
    fingerprint_changes,
)

pytestmark = pytest.mark.unit

RECORDED = json.loads(FINGERPRINT_FILE.read_text())


def test_the_built_default_model_is_the_recorded_one(default_llm_dir):
    assert fingerprint_changes(RECORDED, fingerprint(default_llm_dir)) == []


def test_the_readme_question_is_answered_right():
    # README's "Try it" asks this; the fingerprint holds the answer every machine gets.
    assert RECORDED["greedy"][FINGERPRINT_PROMPTS[0]]["text"] == "The capital of France is Paris."


def test_a_changed_reply_is_named_with_the_token_and_the_files_that_changed():
    other = copy.deepcopy(RECORDED)
    reply = other["greedy"][FINGERPRINT_PROMPTS[1]]
    reply["ids"][3] += 1
    reply["text"] = "something else"
    other["sha256"]["model.onnx.data"] = "0" * 64
    changes = fingerprint_changes(RECORDED, other)
    assert changes[0].startswith(repr(FINGERPRINT_PROMPTS[1]))
    assert "from token 3" in changes[0] and "'something else'" in changes[0]
    assert changes[1].startswith("model.onnx.data changed")
    assert len(changes) == 2


def test_other_weights_with_the_same_replies_are_the_same_model():
    # The replies decide: bit-identical weights cannot be promised across CPUs' float kernels.
    other = copy.deepcopy(RECORDED)
    other["sha256"]["model.onnx.data"] = "0" * 64
    assert fingerprint_changes(RECORDED, other) == []


def test_a_reply_that_parts_after_the_agreed_tokens_is_the_same_model():
    # Another CPU's rounding flips a near-tie late in a reply; the agreed prefix still decides.
    other = copy.deepcopy(RECORDED)
    reply = other["greedy"][FINGERPRINT_PROMPTS[1]]
    reply["ids"][AGREED_TOKENS] += 1
    assert fingerprint_changes(RECORDED, other) == []
    reply["ids"][AGREED_TOKENS - 1] += 1
    assert fingerprint_changes(RECORDED, other) != []
