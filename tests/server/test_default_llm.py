"""The default chat model, SmolLM2-135M-Instruct, served for real: answers, log probabilities, the
repetition penalty, stop strings, `n`, streaming and disconnects, through the `openai` SDK.

References are in-process onnxruntime-genai Generators on the same folder (tests/llm/reference_og).
The log-probability checks run on the tiny model too (same server), so both a 2-layer toy and a
real 30-layer model are held to the in-process log-softmax.
"""

from __future__ import annotations

import time

import httpx
import onnxruntime_genai as og
import openai
import pytest

from ferry.bench.server_process import (
    DEFAULT_LLM,
    DEFAULT_LLM_DIR,
    TINY_LLM,
    TINY_LLM_DIR,
    ferry_server,
)
from ferry.llm.chat_tokenizer import ChatTokenizer
from tests.llm.reference_og import eos_ids, greedy, prompt_logprobs
from tests.support.llm_configs import default_llm_config, tiny_llm_config
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

MODEL_DIRS = {DEFAULT_LLM: DEFAULT_LLM_DIR, TINY_LLM: TINY_LLM_DIR}
PROMPTS = {DEFAULT_LLM: "What is the capital of France?", TINY_LLM: "def fibonacci(n):"}
WAIT_S = 60
PENALTY = {"repetition_penalty": 1.3}  # vLLM's extension: the SDK sends it as extra_body


@pytest.fixture(scope="module")
def server(default_llm_dir):
    with ferry_server(models=[], llm_models=[default_llm_config(), tiny_llm_config()]) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def references():
    """name -> (og.Model, ChatTokenizer, end-of-sequence ids), loaded once."""
    return {n: (og.Model(str(d)), ChatTokenizer(d), eos_ids(d)) for n, d in MODEL_DIRS.items()}


def ask(client, question: str, model: str = DEFAULT_LLM, **kwargs):
    messages = [{"role": "user", "content": question}]
    args = {"max_tokens": 16, "temperature": 0, **kwargs}
    return client.chat.completions.create(model=model, messages=messages, **args)


@pytest.mark.parametrize(
    ("question", "word"),
    [
        ("What is the capital of France?", "Paris"),
        ("What is the largest planet in our solar system?", "Jupiter"),
        ("What is the capital of Japan?", "Tokyo"),
    ],
)
def test_greedy_answers_name_the_fact(client, question, word):
    assert word in ask(client, question).choices[0].message.content


@pytest.mark.parametrize("model", [DEFAULT_LLM, TINY_LLM])
def test_chat_logprobs_are_the_in_process_log_softmax(client, references, model):
    og_model, chat, eos = references[model]
    prompt = PROMPTS[model]
    ids, rows = greedy(og_model, chat.encode_chat([{"role": "user", "content": prompt}]), 8, eos)
    choice = ask(client, prompt, model, max_tokens=8, logprobs=True, top_logprobs=3).choices[0]
    served = choice.logprobs.content
    assert "".join(t.token for t in served) == choice.message.content == chat.decode(ids)
    # One entry a token, and one more for the end-of-sequence token when one stopped the answer.
    stopped = len(ids) < 8
    assert len(served) == len(ids) + stopped
    for token_id, row, entry in zip(ids, rows, served[: len(ids)], strict=True):
        assert entry.logprob == pytest.approx(row[token_id], abs=1e-4)
        best = sorted(row, reverse=True)[:3]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(best, abs=1e-4)


@pytest.mark.parametrize("model", [DEFAULT_LLM, TINY_LLM])
def test_echoed_prompt_logprobs_are_the_in_process_log_softmax(client, references, model):
    og_model, chat, _ = references[model]
    ids = chat.encode(PROMPTS[model])
    rows = prompt_logprobs(og_model, ids)
    result = client.completions.create(
        model=model, prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=1
    )
    served = result.choices[0].logprobs.token_logprobs[: len(ids)]
    assert served[0] is None
    expected = [rows[i - 1, ids[i]] for i in range(1, len(ids))]
    assert served[1:] == pytest.approx(expected, abs=1e-4)


def test_repetition_penalty_applies_with_logprobs_and_with_echo(client, references):
    og_model, chat, eos = references[DEFAULT_LLM]
    question = "Write a poem about dreams."
    ids = chat.encode_chat([{"role": "user", "content": question}])
    plain, _ = greedy(og_model, ids, 32, eos)
    penalised, _ = greedy(og_model, ids, 32, eos, repetition_penalty=1.3)
    assert penalised != plain  # the penalty changes this answer: the checks below can fail
    expected = chat.decode(penalised)
    # The batch lane (numpy sampling), with logprobs too, and with echo (whose prompt goes in
    # scored; test_ortgenai_batch holds it to the og.Generator lane, with the penalty too).
    batch_lane = ask(client, question, max_tokens=32, extra_body=PENALTY)
    with_logprobs = ask(client, question, max_tokens=32, extra_body=PENALTY, logprobs=True)
    echoed = client.completions.create(
        model=DEFAULT_LLM, prompt=ids, max_tokens=32, temperature=0, echo=True, extra_body=PENALTY
    )
    assert batch_lane.choices[0].message.content == expected
    assert with_logprobs.choices[0].message.content == expected
    assert echoed.choices[0].text == chat.decode(ids) + expected


def test_what_onnxruntime_genai_cannot_honour_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError, match="not supported by the engine") as info:
        ask(client, "hi", extra_body={"frequency_penalty": 0.5})
    assert info.value.body["param"] == "frequency_penalty"


def test_a_stop_string_cuts_the_answer(client):
    choice = ask(client, "What is the capital of France?", stop=[" Paris"]).choices[0]
    assert choice.message.content == "The capital of France is"
    assert choice.finish_reason == "stop"


def test_n_choices_and_the_stream_give_the_greedy_answer(client):
    # A question without near-ties in its answer: the int4 kernels round a batch of three
    # otherwise than one request on some CPUs, which flips a near-tie (this AVX2 box: the
    # largest planet's answer at its tenth token).
    question = "What is the capital of France?"
    single = ask(client, question).choices[0].message.content
    assert [c.message.content for c in ask(client, question, n=3).choices] == [single] * 3
    chunks = list(ask(client, question, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == single


def test_a_disconnect_aborts_a_long_generation(server):
    def metric(name: str, **labels: str) -> float:
        return metric_value(server.metrics(), name, model=DEFAULT_LLM, **labels)

    aborted = metric("ferry_llm_requests_finished_total", finish_reason="abort")
    tokens = metric("ferry_llm_generation_tokens_total")
    body = {
        "model": DEFAULT_LLM,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 4000,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    deadline = time.monotonic() + WAIT_S
    while metric("ferry_llm_requests_finished_total", finish_reason="abort") == aborted:
        assert time.monotonic() < deadline, "the disconnected generation was never aborted"
        time.sleep(0.05)
    # Aborted long before its 4000 tokens (about 10 ms each here).
    assert metric("ferry_llm_generation_tokens_total") - tokens < 1000
