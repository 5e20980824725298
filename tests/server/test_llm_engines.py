"""[[llm_models]] settings reach the engine: role injection stays off unless allowed."""

from __future__ import annotations

import pytest

from ferry.bench.server_process import TINY_LLM, TINY_LLM_DIR
from ferry.server.llm_engines import build_llm_engine
from ferry.server.settings import LLMSettings
from tests.llm.test_chat_tokenizer import INJECTION, control_ids


@pytest.mark.parametrize(("allowed", "turn_starts"), [(False, 2), (True, 3)])
def test_special_tokens_in_content_follow_the_model_config(allowed, turn_starts):
    settings = LLMSettings(name=TINY_LLM, path=TINY_LLM_DIR, special_tokens_in_content=allowed)
    engine = build_llm_engine(settings)
    chat = engine.tokenizer
    ids = chat.encode_chat([{"role": "user", "content": INJECTION}])
    # The template opens two turns (user, assistant); a third comes only from the content.
    assert ids.count(control_ids(chat)["<|im_start|>"]) == turn_starts
