"""Per-GPU memory and utilisation through NVML, read at scrape time.

A prometheus_client custom collector: nothing polls in the background, each scrape asks NVML
(a few microseconds per call). Without nvidia-ml-py, an NVIDIA driver or a GPU, the families
are simply absent, as vLLM's and Triton's GPU gauges are on a CPU host.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

LABELS = ["gpu", "uuid", "name"]
MEMORY_USED = "ferry_gpu_memory_used_bytes"
MEMORY_TOTAL = "ferry_gpu_memory_total_bytes"
UTILIZATION = "ferry_gpu_utilization_ratio"


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(
            MEMORY_USED, "GPU memory in use (all processes), from NVML.", labels=LABELS
        ),
        GaugeMetricFamily(MEMORY_TOTAL, "GPU memory in total, from NVML.", labels=LABELS),
        GaugeMetricFamily(
            UTILIZATION,
            "Share of the last sample period (1/6 s to 1 s) during which a kernel ran, from NVML.",
            labels=LABELS,
        ),
    )


def load_nvml() -> Any | None:
    """pynvml, initialised; None where there is no library, driver or GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no libnvidia-ml.so, no driver, no device
        logger.info("GPU metrics off: %s", exc)
        return None
    return pynvml


class GpuCollector(Collector):
    """Collects ferry_gpu_* for every GPU NVML sees. `nvml`: pynvml, or a stand-in in tests."""

    def __init__(self, nvml: Any | None) -> None:
        self._nvml = nvml

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Registration checks names on describe(); the families exist whether or not a GPU does.
        yield from _families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nvml = self._nvml
        if nvml is None:
            return
        used, total, utilization = _families()
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                labels = [
                    str(index),
                    _text(nvml.nvmlDeviceGetUUID(handle)),
                    _text(nvml.nvmlDeviceGetName(handle)),
                ]
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                used.add_metric(labels, float(memory.used))
                total.add_metric(labels, float(memory.total))
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                utilization.add_metric(labels, rates.gpu / 100.0)
        except nvml.NVMLError as exc:  # a GPU lost mid-scrape: skip this scrape's GPU series
            logger.warning("GPU metrics: NVML failed: %s", exc)
            return
        yield from (used, total, utilization)


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes.
    return value.decode() if isinstance(value, bytes) else value
