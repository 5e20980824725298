"""Triton's perf_analyzer runs against Ferry unchanged: KServe v2 HTTP and gRPC (token ids, and
FP32 rows to a tabular model), and OpenAI mode.

The binary comes from tools/install_perf_analyzer.sh (make test runs it). Each run is short and
its figures are not checked (a shared CI machine): only that perf_analyzer completes a
measurement, with server-side statistics where it reads them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import onnxruntime as ort
import pytest

from ferry.bench.server_process import (
    DEFAULT_MODEL,
    REPO,
    TINY_LLM,
    default_model_config,
    ferry_server,
    free_port,
)
from tests.support import plain_graphs
from tests.support.llm_configs import tiny_llm_config

pytestmark = pytest.mark.system

PERF_ANALYZER = REPO / ".perf_analyzer" / "perf_analyzer"
# Short count windows, any spread accepted: the test checks the protocol, not the speed.
MEASURE = [
    "--concurrency-range=2",
    "--measurement-mode=count_windows",
    "--measurement-request-count=10",
    "--stability-percentage=100000",
    "--max-trials=3",  # stability is judged over the last three windows
]
TOKENS = {
    "data": [
        {"input_ids": {"content": [101, 7592, 2088, 102], "shape": [4]}},
        {
            "input_ids": {"content": [101, 2023, 2003, 1037, 2936, 6251, 102], "shape": [7]},
            "attention_mask": {"content": [1] * 7, "shape": [7]},
        },
    ]
}
CHAT = {
    "data": [
        {
            "payload": [
                {
                    "model": TINY_LLM,
                    "messages": [{"role": "user", "content": "def f(x):"}],
                    "max_tokens": 4,
                }
            ]
        }
    ]
}


@pytest.fixture(scope="module")
def tabular(tmp_path_factory) -> Path:
    """The breast-cancer gradient boosting model: one FP32 input, X [N, 30]."""
    return plain_graphs.breast_cancer(
        tmp_path_factory.mktemp("gb") / "gb.onnx", "gradient_boosting"
    )


@pytest.fixture(scope="module")
def server(tabular):
    if not PERF_ANALYZER.exists():
        pytest.fail("perf_analyzer missing: run tools/install_perf_analyzer.sh (make test does)")
    port = free_port()
    with ferry_server(
        [default_model_config()],
        server={"grpc_port": port, "allow_client_shm": True},
        llm_models=[tiny_llm_config()],
        args=["--model", f"gb={tabular}"],
    ) as handle:
        handle.grpc_url = f"127.0.0.1:{port}"
        yield handle


def perf_analyzer(tmp_path: Path, data: dict | None, *args: str) -> str:
    """A short measurement (`data` None: perf_analyzer's own random inputs)."""
    inputs = []
    if data is not None:
        data_file = tmp_path / "data.json"
        data_file.write_text(json.dumps(data))
        inputs = [f"--input-data={data_file}"]
    env = {**os.environ, "LD_LIBRARY_PATH": str(PERF_ANALYZER.parent / "lib")}
    run = subprocess.run(
        [str(PERF_ANALYZER), *inputs, *MEASURE, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "terminate called" not in output, output
    return output


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_kserve_v2(server, tmp_path, protocol):
    url = server.grpc_url if protocol == "grpc" else server.url.removeprefix("http://")
    output = perf_analyzer(tmp_path, TOKENS, "-m", DEFAULT_MODEL, "-i", protocol, "-u", url)
    assert re.search(r"Throughput: [0-9.]+ infer/sec", output), output
    # Server side: perf_analyzer read Ferry's statistics extension.
    count = re.search(r"Server:\s+Inference count: (\d+)", output)
    assert count and int(count.group(1)) >= 10, output


def rows_with_answers(tabular: Path, count: int) -> dict:
    """Real rows as FP32 inputs, each with what ONNX Runtime answers it alone, which
    perf_analyzer checks every answer against, byte for byte (validation_data)."""
    rows = plain_graphs.breast_cancer_rows()[:count]
    session = ort.InferenceSession(str(tabular))
    answers = []
    for row in rows:
        (label,), (probabilities,) = session.run(None, {"X": row[None]})
        answers.append(
            {
                "output_label": {"content": [int(label)]},
                "output_probability": {"content": list(probabilities.values())},
            }
        )
    return {
        # The batch axis is implicit (max_batch_size > 0): a row's shape is [30].
        "data": [{"X": {"content": row.tolist(), "shape": [30]}} for row in rows],
        "validation_data": answers,
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fp32_rows_to_a_tabular_model(server, tabular, tmp_path, protocol):
    url = server.grpc_url if protocol == "grpc" else server.url.removeprefix("http://")
    data = rows_with_answers(tabular, 8)
    output = perf_analyzer(tmp_path, data, "-m", "gb", "-i", protocol, "-u", url)
    assert re.search(r"Throughput: [0-9.]+ infer/sec", output), output
    count = re.search(r"Server:\s+Inference count: (\d+)", output)
    assert count and int(count.group(1)) >= 10, output


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory(server, tabular, tmp_path, protocol):
    """`--shared-memory system`: perf_analyzer creates and registers its regions, every input
    is read from one and every output written into one. Its answers are not validated here:
    perf_analyzer checks the response's own data, which an output in a region never has
    (tests/clients/test_triton_shm.py checks the regions' answers)."""
    url = server.grpc_url if protocol == "grpc" else server.url.removeprefix("http://")
    data = {"data": rows_with_answers(tabular, 8)["data"]}
    output = perf_analyzer(
        tmp_path,
        data,
        *("-m", "gb", "-i", protocol, "-u", url, "--shared-memory=system"),
        "--output-shared-memory-size=64",
    )
    assert re.search(r"Throughput: [0-9.]+ infer/sec", output), output
    count = re.search(r"Server:\s+Inference count: (\d+)", output)
    assert count and int(count.group(1)) >= 10, output


def test_openai_chat(server, tmp_path):
    output = perf_analyzer(
        tmp_path,
        CHAT,
        *("-m", TINY_LLM, "--service-kind", "openai", "--endpoint", "v1/chat/completions"),
        *("--async", "-u", server.url.removeprefix("http://")),
    )
    assert re.search(r"Throughput: [0-9.]+ infer/sec", output), output


# Triton's `simple` over a gRPC stream, and its sequence models, whose requests perf_analyzer
# sends as sequences (sequence_id, start, end) since their config has sequence_batching.
@pytest.mark.parametrize(
    ("model", "protocol", "streaming"),
    [
        ("simple", "grpc", True),
        ("simple_sequence", "grpc", True),
        ("simple_dyna_sequence", "grpc", True),
        ("simple_sequence", "grpc", False),
        ("simple_sequence", "http", False),
    ],
)
def test_triton_models_and_sequences(triton_models, tmp_path, model, protocol, streaming):
    server = triton_models
    url = server.grpc_address if protocol == "grpc" else server.http_address
    args = ["-m", model, "-i", protocol, "-u", url, *(["--streaming"] if streaming else [])]
    output = perf_analyzer(tmp_path, None, *args)
    assert re.search(r"Throughput: [0-9.]+ infer/sec", output), output
    count = re.search(r"Server:\s+Inference count: (\d+)", output)
    assert count and int(count.group(1)) >= 10, output
