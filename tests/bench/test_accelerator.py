"""The simulated device (bench/simulated_device.py) and bench.accelerator's report.

No timing thresholds: what is checked is what the device does (answers, streams, counters) and
what Ferry does with it (batches grow under load), never how fast.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from dataclasses import replace

import httpx
import numpy as np
import pytest

from ferry.batcher import TokenSequence, pad_batch
from ferry.bench.accelerator import (
    IMAGE_MODEL,
    IMAGES,
    MODULES,
    NULL,
    SIMULATED,
    Config,
    Results,
    batch_totals,
    device_ceilings,
    image_bodies,
    image_model_config,
    report,
)
from ferry.bench.loadgen import run_load
from ferry.bench.server_process import default_model_config, ferry_server
from ferry.bench.simulated_device import (
    ENV,
    DeviceStats,
    DeviceTimes,
    SimulatedDevice,
    SimulatedEncoderBackend,
    hold_gil,
)
from ferry.bench.sweep import Step
from ferry.bench.targets import predict_body
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

# A slow device (20 ms a batch without the GIL): batches overlap whenever two are ready, so two
# in flight under load do not depend on how busy the machine is.
SLOW = DeviceTimes(launch_ms=0.5, fixed_ms=20.0, per_token_us=0.2, streams=2)


def test_times_come_from_the_environment_and_a_typo_fails():
    assert DeviceTimes.from_env({}) == DeviceTimes()
    assert DeviceTimes.from_env(SLOW.to_env()) == SLOW
    with pytest.raises(ValueError, match="launch_ms"):
        DeviceTimes.from_env({ENV: json.dumps({"lanch_ms": 2})})


def test_a_batch_costs_its_fixed_time_and_its_padded_tokens():
    times = DeviceTimes(launch_ms=1.5, fixed_ms=1.0, per_token_us=0.2)
    assert times.device_s(128 * 128) == pytest.approx(0.001 + 16384 * 0.2e-6)
    assert times.batch_s(16) == pytest.approx(0.0015 + 0.001 + 16 * 0.2e-6)


def test_a_launch_runs_its_whole_time_on_the_gil_while_another_thread_wants_it():
    """A launch shared with a busy loop still costs its whole time of GIL, as launch code in
    Python does: it must not count the loop's turns as its own."""
    used: list[float] = []
    stop = threading.Event()

    def launch() -> None:
        began = time.thread_time()
        hold_gil(0.03)
        used.append(time.thread_time() - began)
        stop.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # the loop takes the GIL from the launch every 0.5 ms
    try:
        thread = threading.Thread(target=launch)
        thread.start()
        turns = 0
        while not stop.is_set():  # the event loop's Python, wanting the GIL all along
            turns += 1
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert turns and used[0] >= 0.03


@pytest.mark.parametrize("launch_on_loop", [False, True], ids=["stream-threads", "on-loop"])
def test_the_device_counts_batches_and_runs_no_more_than_its_streams(tmp_path, launch_on_loop):
    stats_file = tmp_path / "device.json"
    times = DeviceTimes(0.1, 20.0, 0.0, streams=2, launch_on_loop=launch_on_loop)
    device = SimulatedDevice(replace(times, stats_file=str(stats_file)))

    async def six_batches() -> None:
        await asyncio.gather(*(device.run(rows=4, padded_tokens=4 * 16) for _ in range(6)))

    asyncio.run(six_batches())
    # On the loop: no stream thread was ever started.
    started = any(t.name.startswith("sim-stream") for t in threading.enumerate())
    device.close()
    assert started != launch_on_loop
    stats = DeviceStats.read(stats_file)
    assert (stats.batches, stats.rows, stats.padded_tokens) == (6, 24, 6 * 64)
    assert stats.max_in_flight == 2 and stats.in_flight == 0
    assert stats.launch_s > 0


def test_the_encoder_backend_answers_a_row_of_the_model_width_per_sequence():
    backend = SimulatedEncoderBackend(DeviceTimes(0.1, 0.1, 0.0))
    batch = pad_batch(
        [TokenSequence.from_ids([101, 7592, 102]), TokenSequence.from_ids([101, 102])]
    )
    outputs = asyncio.run(backend.infer(batch))
    assert outputs["sentence_embedding"].shape == (2, 384)
    assert backend.max_concurrency == 2 and backend.device.stats.padded_tokens == 2 * 3


def test_the_device_ceiling_runs_batches_of_each_client_count():
    config = Config(
        0.0, 0.0, (2, 8), {"short": [[101, 2000, 102]] * 16}, DeviceTimes(0.1, 0.1, 0.0)
    )
    ceilings = asyncio.run(device_ceilings(config))
    assert set(ceilings) == {(s, c) for s in ("short", IMAGES) for c in (2, 8)}
    assert all(v > 0 for v in ceilings.values())


def test_batch_totals_read_the_histogram_of_every_model():
    metrics = (
        "# TYPE ferry_batch_size_requests histogram\n"
        'ferry_batch_size_requests_sum{model="a"} 30.0\n'
        'ferry_batch_size_requests_count{model="a"} 3.0\n'
        'ferry_batch_size_requests_sum{model="b"} 2.0\n'
        'ferry_batch_size_requests_count{model="b"} 2.0\n'
    )
    assert batch_totals(metrics) == (32.0, 5.0)


def test_report_gives_both_ratios_and_the_verdict():
    config = Config(1.0, 0.0, (64,), {"short": [[101, 102]]}, DeviceTimes())
    results = Results()
    results.steps[(SIMULATED, "short", 64)] = Step(64, 900, 900.0, 1.0, 2.0, {200: 900})
    results.steps[(NULL, "short", 64)] = Step(64, 1000, 1000.0, 1.0, 2.0, {200: 1000})
    results.ceilings[("short", 64)] = 9000.0
    results.mean_batch[(SIMULATED, "short", 64)] = 12.5
    results.mean_batch[(NULL, "short", 64)] = 3.5
    results.round_ratios[("short", 64)] = [0.8, 1.0]
    text = report(config, results)
    assert " 0.90x    0.10x  12.5" in text
    assert " 1.00x    0.11x  3.5" in text  # the null backend's batches too
    assert "short/64: 0.90x null (rounds: 0.80, 1.00) -> met" in text


async def _answers(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await asyncio.gather(*(client.post("/predict", json=b) for b in bodies))


@pytest.mark.parametrize("api_servers", [1, 2], ids=["api1", "api2"])
def test_a_server_on_the_simulated_device_batches_more_under_load(tmp_path, api_servers):
    """Behind a real server (with API processes: in the engine process they feed)."""
    stats_file = tmp_path / "device.json"
    env = DeviceTimes(**{**SLOW.__dict__, "stats_file": str(stats_file)}).to_env()
    env["FERRY_GIL_SWITCH_INTERVAL_MS"] = "0.7"
    rng = np.random.default_rng(0)
    bodies = [predict_body([101, *rng.integers(2000, 29000, n).tolist(), 102]) for n in range(40)]
    with ferry_server(
        [default_model_config()],
        {"api_servers": api_servers},
        env=env,
        module="ferry.bench.simulated_device",
    ) as server:
        alone = asyncio.run(run_load(server.url, bodies[:10], 1))
        metrics = server.metrics()
        one_rows = metric_value(metrics, "ferry_batch_size_requests_sum")
        one_batches = metric_value(metrics, "ferry_batch_size_requests_count")
        answers = asyncio.run(_answers(server.url, bodies))
        loaded = asyncio.run(run_load(server.url, bodies, 32, duration_s=1.5))
        metrics = server.metrics()
        rows = metric_value(metrics, "ferry_batch_size_requests_sum") - one_rows
        batches = metric_value(metrics, "ferry_batch_size_requests_count") - one_batches
    assert alone.statuses == {200: 10} and loaded.statuses.get(200, 0) == loaded.completed > 0
    for response in answers:
        assert response.status_code == 200
        assert np.array(response.json()["outputs"][0]["sentence_embedding"]).shape == (384,)
    # One client: a request a batch. Under load: batches of several.
    assert one_rows / one_batches == 1.0
    assert rows / batches > one_rows / one_batches
    stats = DeviceStats.read(stats_file)
    assert stats.max_in_flight >= 2
    # The stream threads wait that long at most for the GIL the busy loop holds, not 5 ms.
    assert stats.switch_interval_s == pytest.approx(0.0007)


@pytest.mark.parametrize("name", [SIMULATED, NULL])
def test_a_plain_graph_answers_image_tensors_with_zeros_of_its_output_shape(tmp_path, name):
    """The image set's graph keeps its own signature on both stand-in backends; on the
    simulated device its batches are counted by the row."""
    stats_file = tmp_path / "device.json"
    env = DeviceTimes(**{**SLOW.__dict__, "stats_file": str(stats_file)}).to_env()
    config = Config(1.0, 0.0, (4,), {}, SLOW)
    body = image_bodies(count=1)[0]
    with ferry_server(
        [image_model_config(config, tmp_path)], env=env, module=MODULES[name]
    ) as server:
        answer = httpx.post(f"{server.url}/v2/models/{IMAGE_MODEL}/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    (logits,) = answer.json()["outputs"]
    assert (logits["name"], logits["shape"]) == ("logits", [1, 1000])
    assert not any(logits["data"])
    if name == SIMULATED:  # this request's row, and the batch plan's probe at start
        assert DeviceStats.read(stats_file).rows >= 2
