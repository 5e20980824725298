"""The raw og.Engine baseline of bench.llm_load, on the tiny model: every request runs to its
token limit with no more requests in the engine than asked."""

from __future__ import annotations

import pytest

from ferry.bench.og_direct import og_engine_run
from ferry.llm.chat_tokenizer import ChatTokenizer
from tests.llm.llm_paths import ONNX_DIR

pytestmark = pytest.mark.unit


def test_every_request_gets_its_tokens_timed_in_order():
    chat = ChatTokenizer(ONNX_DIR)
    prompts = [chat.encode_chat([{"role": "user", "content": p}]) for p in ("import os", "x = 1")]
    tokens_per_s, runs = og_engine_run(ONNX_DIR, prompts * 2, 2, 5)
    assert len(runs) == 4 and tokens_per_s > 0
    for started, times in runs:
        assert 0 < len(times) <= 5
        stamps = [started] + [t for t, _ in times]
        assert stamps == sorted(stamps)
