"""guidellm, unchanged (its own CLI and defaults: chat completions, streamed, `ignore_eos` for
an exact output length, `stream_options.continuous_usage_stats`), benchmarks the default chat
model through Ferry: it probes `GET /health`, takes the first model `/v1/models` lists, and
every request completes with exactly the tokens it asked for.

Only its tokenizer is named: the synthetic prompts are made with the served model's own (the
local Hugging Face folder; offline, guidellm would otherwise download it by the model's name).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.bench.server_process import DEFAULT_LLM_HF_DIR

pytestmark = pytest.mark.integration

REQUESTS = 4
OUTPUT_TOKENS = 16


def test_guidellm_runs_unchanged_and_every_request_gets_its_tokens(llm_server, tmp_path):
    guidellm = shutil.which("guidellm", path=str(Path(sys.executable).parent))
    assert guidellm is not None, "guidellm is in the test extra: make setup installs it"
    report = tmp_path / "report.json"
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    run = subprocess.run(
        [
            guidellm,
            "run",
            "--backend",
            f"kind=openai_http,target={llm_server.url}",
            "--profile",
            "kind=synchronous",
            "--constraint",
            f"kind=max_requests,count={REQUESTS}",
            "--data",
            f"kind=synthetic_text,prompt_tokens=32,output_tokens={OUTPUT_TOKENS}",
            "--tokenizer",
            f"kind=hf_auto,model={DEFAULT_LLM_HF_DIR}",
            "--output",
            f"kind=json,path={report}",
            "--disable-console-interactive",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    metrics = benchmark["metrics"]
    totals = metrics["request_totals"]
    assert totals["errored"] == totals["incomplete"] == 0, totals
    # guidellm's measured window ends when its max_requests constraint stops the run, and the
    # last request may finish after that on a busy host: it is then left out of the totals (a
    # fresh run counted 3 of 4, none errored or incomplete). Every request it counts succeeded.
    assert totals["successful"] == totals["total"] and REQUESTS - 1 <= totals["total"] <= REQUESTS
    produced = metrics["output_token_count"]["successful"]
    assert produced["min"] == produced["max"] == OUTPUT_TOKENS  # ignore_eos: none ended early
