"""schemathesis against the running server's own OpenAPI schema, with every route live: the
default encoder and the tiny LLM are served and every `model` field is pinned to them
(tests/server/fuzz_hooks.py). No 5xx, no schema violations, and schema-invalid requests refused
(the checks are chosen in schemathesis.toml)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ferry.bench.server_process import DEFAULT_MODEL, REPO, TINY_LLM, ferry_server
from tests.support.llm_configs import tiny_llm_config
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

# Per operation in the fuzzing phase. The coverage phase sends its own boundary and negative
# cases besides (3,849 of them, 60% of the run); at 40 the fuzzing phase took 80 s of a 234 s
# run, at 10 it takes 22 s and still sends every operation random bodies.
EXAMPLES = "10"


# Upper bounds only: 47 operations take the fuzzer 7-9 minutes of one core on this 2-core box,
# and the suite's other worker shares it; beside a CPU hog, 840 s was not enough.
@pytest.mark.timeout(1800)
def test_fuzzing_every_endpoint_finds_no_server_error_or_schema_violation():
    st = REPO / ".venv" / "bin" / "st"
    config = Path(__file__).with_name("schemathesis.toml")
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.server.fuzz_hooks",
        "FERRY_FUZZ_ENCODER": DEFAULT_MODEL,
        "FERRY_FUZZ_LLM": TINY_LLM,
        "PYTHONPATH": str(REPO),
    }
    # Short generations: the fuzzer asks for many, and the 2-core machine runs them all.
    llm = tiny_llm_config(max_running=2, max_waiting=64)
    with ferry_server(llm_models=[llm]) as server:
        done = subprocess.run(
            [
                str(st),
                "--config-file",
                str(config),
                "run",
                f"{server.url}/openapi.json",
                "--max-examples",
                EXAMPLES,
                "--seed",
                "1",
                "--request-timeout",
                "60",
                "--generation-deterministic",
            ],
            capture_output=True,
            text=True,
            timeout=1700,
            cwd=REPO,
            env=env,
        )
        metrics = server.metrics()
    assert done.returncode == 0, done.stdout[-8000:]
    # The pinned names took: requests reached the batcher and the LLM, not just 404s.
    assert metric_value(metrics, "ferry_batch_size_requests_count", model=DEFAULT_MODEL) > 20
    assert metric_value(metrics, "ferry_llm_generation_tokens_total", model=TINY_LLM) > 20
