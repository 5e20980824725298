"""ferry_gpu_*: read from NVML at scrape time, one series per GPU, absent without a GPU.

No GPU here: the collector runs against a stand-in for pynvml's functions (the library boundary);
`load_nvml` runs for real and finds no NVIDIA driver. The `gpu` test reads a real GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ferry.server.gpu_metrics import GpuCollector, load_nvml
from ferry.server.metrics import FerryMetrics
from tests.gpu import nvidia_gpu_present, requires_gpu

pytestmark = pytest.mark.unit

GIB = 1024**3


class FakeNVMLError(Exception):
    pass


@dataclass
class Memory:  # shaped like pynvml's c_nvmlMemory_t
    total: int
    free: int
    used: int


@dataclass
class Utilization:  # shaped like pynvml's c_nvmlUtilization_t
    gpu: int
    memory: int


class FakeNVML:
    """pynvml's functions over a list of (name, used bytes, total bytes, utilisation %)."""

    NVMLError = FakeNVMLError

    def __init__(self, gpus: list[tuple[str, int, int, int]]) -> None:
        self.gpus = gpus
        self.fail = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if self.fail:
            raise FakeNVMLError("GPU is lost")
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle:04d}".encode()  # older releases answer bytes

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.gpus[handle][0]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:
        _, used, total, _ = self.gpus[handle]
        return Memory(total, total - used, used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Utilization:
        return Utilization(self.gpus[handle][3], 0)


def scrape(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """(series name, gpu label) -> value, for the ferry_gpu_* series."""
    text = generate_latest(registry).decode()
    return {
        (sample.name, sample.labels["gpu"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("ferry_gpu_")
    }


def registry_with(nvml) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(GpuCollector(nvml))
    return registry


def test_one_series_per_gpu_with_its_labels():
    nvml = FakeNVML([("NVIDIA H100 80GB HBM3", 3 * GIB, 80 * GIB, 37), ("NVIDIA L4", 0, GIB, 0)])
    values = scrape(registry_with(nvml))
    assert values == {
        ("ferry_gpu_memory_used_bytes", "0"): 3 * GIB,
        ("ferry_gpu_memory_total_bytes", "0"): 80 * GIB,
        ("ferry_gpu_utilization_ratio", "0"): 0.37,
        ("ferry_gpu_memory_used_bytes", "1"): 0,
        ("ferry_gpu_memory_total_bytes", "1"): GIB,
        ("ferry_gpu_utilization_ratio", "1"): 0.0,
    }
    text = generate_latest(registry_with(nvml)).decode()
    assert 'uuid="GPU-0000"' in text and 'name="NVIDIA H100 80GB HBM3"' in text


def test_values_are_read_at_each_scrape():
    nvml = FakeNVML([("gpu", GIB, 8 * GIB, 10)])
    registry = registry_with(nvml)
    assert scrape(registry)[("ferry_gpu_memory_used_bytes", "0")] == GIB
    nvml.gpus[0] = ("gpu", 5 * GIB, 8 * GIB, 90)
    values = scrape(registry)
    assert values[("ferry_gpu_memory_used_bytes", "0")] == 5 * GIB
    assert values[("ferry_gpu_utilization_ratio", "0")] == 0.9


def test_an_nvml_failure_drops_the_gpu_series_not_the_scrape():
    nvml = FakeNVML([("gpu", GIB, 8 * GIB, 10)])
    nvml.fail = True
    registry = registry_with(nvml)
    registry.register(FerryMetrics().registry)  # the rest of the scrape still answers
    assert scrape(registry) == {}
    assert "ferry_queue_depth" in generate_latest(registry).decode()


@pytest.mark.skipif(nvidia_gpu_present(), reason="checks a host without an NVIDIA GPU")
def test_absent_without_a_gpu():
    assert load_nvml() is None  # the real pynvml: no libnvidia-ml here
    assert "ferry_gpu_" not in generate_latest(FerryMetrics().registry).decode()


@pytest.mark.gpu
@requires_gpu
def test_real_gpu_memory_is_exported():
    values = scrape(FerryMetrics().registry)
    assert values[("ferry_gpu_memory_total_bytes", "0")] > GIB
    assert (
        0
        < values[("ferry_gpu_memory_used_bytes", "0")]
        <= values[("ferry_gpu_memory_total_bytes", "0")]
    )
    assert 0.0 <= values[("ferry_gpu_utilization_ratio", "0")] <= 1.0
