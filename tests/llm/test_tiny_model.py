"""The committed tiny model: complete, small, and greedy-identical across runtimes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnxruntime_genai as og
import pytest

from ferry.llm.chat_tokenizer import ChatTokenizer
from tests.llm.llm_paths import HF_DIR, ONNX_DIR, TINY_LLM

pytestmark = pytest.mark.unit


def test_model_folders_are_complete_and_small() -> None:
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        assert (HF_DIR / name).is_file(), name
    for name in ("genai_config.json", "model.onnx", "tokenizer.json", "tokenizer_config.json"):
        assert (ONNX_DIR / name).is_file(), name
    total = sum(p.stat().st_size for p in TINY_LLM.rglob("*") if p.is_file())
    assert total < 14 * 2**20


def test_chat_template_and_tokenizer_match_the_reference(reference: dict[str, Any]) -> None:
    chat = ChatTokenizer(HF_DIR)
    for case in reference["cases"]:
        prompt = chat.render_chat(case["messages"])
        assert prompt == case["prompt"]
        assert chat.encode(prompt) == case["prompt_ids"]
    assert chat.eos_token == "<|im_end|>"


def test_ortgenai_tokenizer_agrees_with_hf_tokenizer(reference: dict[str, Any]) -> None:
    tokenizer = og.Tokenizer(og.Model(str(ONNX_DIR)))
    for case in reference["cases"]:
        assert list(tokenizer.encode(case["prompt"])) == case["prompt_ids"]
        rendered = tokenizer.apply_chat_template(
            messages=json.dumps(case["messages"]), add_generation_prompt=True
        )
        assert rendered == case["prompt"]


def test_ortgenai_greedy_ids_match_transformers(reference: dict[str, Any]) -> None:
    model = og.Model(str(ONNX_DIR))
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(16)
    requests = {}
    for i, case in enumerate(reference["cases"]):
        request = engine.create_request()
        turn = og.TurnOptions(request)
        turn.set_do_sample(False)
        turn.set_min_generated_tokens(reference["max_new_tokens"])  # as the reference did
        turn.set_max_generated_tokens(reference["max_new_tokens"])
        request.begin_turn(np.asarray(case["prompt_ids"], dtype=np.int32), turn)
        requests[request] = i
    generated: dict[int, list[int]] = {i: [] for i in requests.values()}
    for _ in range(1000):  # bounded: 20 tokens need ~20 steps
        if not engine.has_pending_requests():
            break
        for event in engine.run(buffer):
            assert not event.flags & og.EngineEventFlags.FAILED
            if event.flags & og.EngineEventFlags.TOKEN:
                generated[requests[event.request]].append(event.token)
    for request in requests:
        request.close()
    for i, case in enumerate(reference["cases"]):
        assert generated[i] == case["new_ids"]
