"""lm-eval, unchanged and with its defaults, scores the default chat model (SmolLM2-135M-Instruct)
through Ferry exactly as the same task computed in-process on the same model.

`local-completions` (token-id prompts, `echo` + `logprobs` loglikelihoods) runs a multiple-choice
task; `local-chat-completions` runs a generation task. Both tasks read local files shipped here:
short factual questions, which a real model mostly gets right.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import pytest
from tokenizers import Tokenizer

from ferry.bench.server_process import DEFAULT_LLM
from ferry.llm.chat_tokenizer import ChatTokenizer
from tests.llm.reference_og import eos_ids, greedy, prompt_logprobs

pytestmark = pytest.mark.integration

DATA = Path(__file__).parent / "data"
CHOICE_TASK = f"""
task: ferry_facts_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {DATA / "facts_choice.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
CONTINUE_TASK = f"""
task: ferry_facts_answer
dataset_path: json
dataset_kwargs:
  data_files:
    test: {DATA / "facts_answer.jsonl"}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 16
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
    regexes_to_ignore: ["\\\\s"]
"""


@pytest.fixture(scope="module")
def server(llm_server):
    return llm_server


@pytest.fixture(scope="module")
def model(default_llm_dir):
    return og.Model(str(default_llm_dir))


def lm_eval(tmp_path: Path, task_yaml: str, *args: str) -> tuple[dict, list[dict]]:
    """The results lm-eval reports, and its logged samples (doc order)."""
    (tmp_path / "task.yaml").write_text(task_yaml)
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    out = tmp_path / "out"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "--include_path",
            str(tmp_path),
            "--log_samples",
            "--output_path",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    (results,) = out.rglob("results_*.json")
    (samples,) = out.rglob("samples_*.jsonl")
    logged = [json.loads(line) for line in samples.read_text().splitlines()]
    return json.loads(results.read_text())["results"], sorted(logged, key=lambda s: s["doc_id"])


def docs(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def loglikelihood(model, tokenizer: Tokenizer, context: str, continuation: str) -> float:
    """lm-eval's split (trailing spaces move to the continuation; the continuation's tokens are
    the whole's after the context's), scored from one forward pass of the prompt."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    whole, ctx = encode(context + continuation), encode(context)
    rows = prompt_logprobs(model, whole)
    return float(sum(rows[i - 1, whole[i]] for i in range(len(ctx), len(whole))))


def greedy_reply(model, model_dir: Path, prompt: str, max_tokens: int, stop: str) -> str:
    chat = ChatTokenizer(model_dir)
    ids = chat.encode(chat.render_chat([{"role": "user", "content": prompt}]))
    new, _ = greedy(model, ids, max_tokens, eos_ids(model_dir))
    return chat.decode(new).split(stop)[0]


def test_multiple_choice_through_local_completions(server, model, default_llm_dir, tmp_path):
    results, samples = lm_eval(
        tmp_path,
        CHOICE_TASK,
        *("--model", "local-completions", "--tasks", "ferry_facts_choice"),
        "--model_args",
        f"model={DEFAULT_LLM},base_url={server.url}/v1/completions,tokenizer={default_llm_dir}",
    )
    tokenizer = Tokenizer.from_file(str(default_llm_dir / "tokenizer.json"))
    correct = []
    for doc, sample in zip(docs("facts_choice.jsonl"), samples, strict=True):
        scores = [loglikelihood(model, tokenizer, doc["question"], f" {c}") for c in doc["choices"]]
        correct.append(int(np.argmax(scores)) == doc["answer"])
        # Every loglikelihood lm-eval got from Ferry is the in-process one.
        served = [float(r[0]) for r in sample["filtered_resps"]]
        assert served == pytest.approx(scores, abs=1e-4)
    expected = float(np.mean(correct))
    assert expected > 1 / 3  # better than chance among three: a model that knows some facts
    assert results["ferry_facts_choice"]["acc,none"] == pytest.approx(expected)


def test_generation_through_local_chat_completions(server, model, default_llm_dir, tmp_path):
    results, _ = lm_eval(
        tmp_path,
        CONTINUE_TASK,
        *("--model", "local-chat-completions", "--tasks", "ferry_facts_answer"),
        "--apply_chat_template",
        "--model_args",
        f"model={DEFAULT_LLM},base_url={server.url}/v1/chat/completions",
    )
    matches = []
    for doc in docs("facts_answer.jsonl"):
        reply = greedy_reply(model, default_llm_dir, doc["prompt"], 16, "\n")
        matches.append(re.sub(r"\s", "", reply) == re.sub(r"\s", "", doc["target"]))
    expected = float(np.mean(matches))
    # Some targets are the model's greedy replies and some are not (which ones depends on the
    # conversion): the metric is checked both ways.
    assert 0 < expected < 1
    assert results["ferry_facts_answer"]["exact_match,none"] == pytest.approx(expected)
