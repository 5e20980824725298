"""The GPU benchmark's parts that run anywhere: load split and merge, the null-backend server,
the placeholder tokenizer, and the verdict against the issue's targets."""

from __future__ import annotations

import httpx
import pytest

from ferry.bench.gpu import FERRY_ORT, UNBATCHED, Config, Results, report, verdicts
from ferry.bench.gpu_model import write_tokenizer
from ferry.bench.loadgen import LoadResult
from ferry.bench.multiload import load_pool, merge, run_load_processes, split_clients
from ferry.bench.server_process import default_model_config, ferry_server
from ferry.bench.sweep import Step
from ferry.bench.targets import predict_body
from ferry.server.tokenization import TextTokenizer
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration


def test_clients_are_split_evenly_and_never_to_an_idle_process():
    assert split_clients(256, 8) == [32] * 8
    assert split_clients(10, 4) == [3, 3, 2, 2]
    assert split_clients(2, 8) == [1, 1]


def test_merge_adds_counts_and_keeps_the_longest_time():
    a = LoadResult([0.01, 0.02], {200: 2}, elapsed_s=1.0)
    b = LoadResult([0.03], {200: 1, 503: 1}, elapsed_s=2.0, refusals_without_retry_after=1)
    merged = merge([a, b])
    assert merged.statuses == {200: 3, 503: 1}
    assert merged.completed == 3 and merged.elapsed_s == 2.0
    assert merged.throughput == 1.5
    assert merged.refusals_without_retry_after == 1


@pytest.mark.parametrize("api_servers", [1, 2], ids=["api1", "api2"])
def test_null_backend_server_under_load_from_two_processes(api_servers):
    """With API processes, the engine process they feed runs the null backend as well."""
    bodies = [predict_body([101, 2000 + i, 102]) for i in range(50)]
    settings = {"api_servers": api_servers}
    module = "ferry.bench.null_backend"
    with (
        ferry_server([default_model_config()], settings, module=module) as server,
        load_pool(2) as pool,
    ):
        one = httpx.post(f"{server.url}/predict", json={"input_ids": [101, 7592, 102]})
        load = run_load_processes(pool, 2, server.url, bodies, 4, duration_s=1.0)
        batched = metric_value(server.metrics(), "ferry_batch_size_requests_sum")
    # The null backend answers zeros of the model's width, through the real front end.
    assert one.json()["outputs"][0]["sentence_embedding"] == [0.0] * 384
    assert load.statuses.get(200, 0) == load.completed > 0
    assert batched == load.completed + 1  # every request went through the batcher


def test_placeholder_tokenizer_maps_its_own_pieces(tmp_path):
    write_tokenizer(tmp_path / "tokenizer.json", 30522)
    tokens = TextTokenizer(tmp_path / "tokenizer.json", 256).encode(["[CLS] [unused2000] [SEP]"])
    assert tokens.input_ids.tolist() == [[101, 2000, 102]]


def step(throughput: float) -> Step:
    return Step(64, int(throughput), throughput, 1.0, 2.0, {200: int(throughput)})


def test_verdict_applies_both_targets():
    config = Config("cuda", 1.0, 0.0, (64,), {"mixed": [[101, 102]]}, 1, 128, 16384)
    results = Results()
    results.steps[(FERRY_ORT, "mixed", 64)] = step(3000)
    results.steps[(UNBATCHED, "mixed", 64)] = step(900)
    results.ceilings[("onnxruntime", "mixed")] = 4000
    assert verdicts(config, results)[1].endswith("3.3x unbatched, 0.75x ceiling -> met")
    results.ceilings[("onnxruntime", "mixed")] = 5000
    assert verdicts(config, results)[1].endswith("-> MISSED")
    assert "3.33x" in report(config, results)  # the x-unbatched column


def test_quick_config_is_tiny():
    from ferry.bench.gpu import config_from, parse_args

    config = config_from(parse_args(["--quick", "--device", "cpu"]))
    assert (config.clients, config.seconds, config.processes) == ((4, 8), 1.0, 1)


def test_api_servers_levels_are_reported_as_peers_of_their_own():
    from ferry.bench.gpu import NULL, api_peer, config_from, parse_args

    config = config_from(parse_args(["--quick", "--device", "cpu", "--api-servers", "1,4"]))
    assert config.api_servers == (1, 4)
    results = Results()
    results.steps[(api_peer(FERRY_ORT, 4), "mixed", 4)] = step(2000)
    results.steps[(api_peer(NULL, 4), "mixed", 4)] = step(8000)
    text = report(config, results)
    assert "ferry onnxruntime api_servers=4" in text and "0.25x" in text  # of null, same level
