"""Which processes serve, chosen from the models and the host when the configuration does not say.

Two layouts spread Ferry's front end over cores (issue 43), and each suits one kind of model:
- **a model on a GPU** gets the engine in its own process (`api_servers`), as vLLM moved its
  engine core out of the API server: the thread that launches kernels then holds its own GIL,
  not the event loop's, and one device is shared by every API process;
- **small CPU models** (tabular, small CNNs, encoders) get `replicas`: whole servers on one port,
  each with its own copy, so no request crosses a process.
Everything else is served by one process. On a host with fewer than MIN_CORES cores a second
replica pays only where the event loop, not the model, is the limit: with the load from wrk
(bench/wrk_load.py), replicas 2 gave 2.06x of one on the tabular model but 0.82x (short) and
0.56x (mixed) on all-MiniLM, whose ONNX Runtime threads already use both cores. Model size cannot
tell the two apart, the graph's ops can: there, only light graphs (light_graphs.py: trees, linear
models, elementwise ops; no matrix product or convolution) get a replica per core.

Setting `api_servers` or `replicas` (file, environment or flag) chooses the layout instead;
the start-up log says which was taken and why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ferry.server.light_graphs import light_graph
from ferry.server.settings import ModelSettings, Settings

# Fewer cores than this: one process (see the module docstring).
MIN_CORES = 4
# Models held by every replica up to this many bytes in all; larger ones are held once.
REPLICA_MODEL_BYTES = 512 * 2**20
MAX_PROCESSES = 8
LAYOUT_FIELDS = frozenset({"api_servers", "replicas"})


@dataclass(frozen=True)
class Host:
    cores: int
    gpu: bool  # an NVIDIA GPU is visible

    @classmethod
    def this(cls) -> Host:
        return cls(len(os.sched_getaffinity(0)), _nvidia_gpu_visible())


@dataclass(frozen=True)
class Layout:
    api_servers: int
    replicas: int
    why: str


def choose_layout(settings: Settings, host: Host) -> Layout:
    """The layout for these settings on this host (the configured one when it sets either)."""
    configured = LAYOUT_FIELDS & settings.model_fields_set
    if configured:
        names = " and ".join(sorted(configured))
        return Layout(settings.api_servers, settings.replicas, f"{names} set in the configuration")
    single = _one_process_reason(settings)
    if single:
        return Layout(1, 1, single)
    small = host.cores < MIN_CORES
    if _on_gpu(settings, host) and not small:
        count = min(MAX_PROCESSES, max(2, host.cores // 4))
        return Layout(
            count,
            1,
            f"a model on the GPU and {host.cores} cores: the engine in its own process, off the "
            "API processes' GIL (set api_servers or replicas to choose)",
        )
    held = sum(_bytes(m.path) for m in settings.models if m.backend.kind != "triton")
    if settings.llm_models or held > REPLICA_MODEL_BYTES:
        why = "LLMs" if settings.llm_models else f"{held / 2**20:.0f} MiB of models"
        why += " on the CPU, held once (set api_servers to spread the front end)"
        return Layout(1, 1, why)
    if not small:
        count = min(MAX_PROCESSES, host.cores // 2)
        return Layout(
            1,
            count,
            f"CPU models of {held / 2**20:.0f} MiB and {host.cores} cores: {count} whole servers "
            "on one port, half the cores left to the backends' threads (set replicas to choose)",
        )
    if host.cores > 1 and settings.models and all(map(_light, settings.models)):
        count = min(MAX_PROCESSES, host.cores)
        return Layout(
            1,
            count,
            f"light CPU graphs (trees, linear models: no matrix products) and {host.cores} cores: "
            f"{count} whole servers on one port, one a core, as the event loop is the limit "
            "(set replicas to choose)",
        )
    return Layout(
        1, 1, f"{host.cores} cores: one process (a second would compete for the same cores)"
    )


def apply_layout(settings: Settings, layout: Layout) -> Settings:
    """The settings with the layout's counts. Not validated again: a layout the rest of the
    configuration refuses (LLMs, sequences or explicit model control with replicas) is never
    chosen (_one_process_reason, choose_layout)."""
    counts = {"api_servers": layout.api_servers, "replicas": layout.replicas}
    return settings.model_copy(update=counts)


def _one_process_reason(settings: Settings) -> str | None:
    if any(m.sequence_batching is not None for m in settings.models):
        return "a model with sequence_batching: its sequences live in one process"
    if settings.model_control_mode == "explicit":
        return "model_control_mode = 'explicit': a load must reach the one process holding models"
    return None


def _on_gpu(settings: Settings, host: Host) -> bool:
    for model in settings.models:
        device = getattr(model.backend, "device", "cpu")
        if device == "cuda" or (device == "auto" and host.gpu):
            return True
    return any(m.options.engine == "vllm" for m in settings.llm_models)


def _light(model: ModelSettings) -> bool:
    return model.backend.kind == "onnxruntime" and light_graph(model.path)


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return 0


def _nvidia_gpu_visible() -> bool:
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())
