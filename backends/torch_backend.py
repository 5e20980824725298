"""PyTorch backend: a Hugging Face encoder folder served as it is, through the same batcher.

No export step: `transformers` loads the folder with SDPA attention, in float16 (or bfloat16) on
CUDA and float32 on the CPU, optionally wrapped in `torch.compile`. Its outputs are those of the
ONNX export (exporters/onnx_export.py): `last_hidden_state` and the mean-pooled, L2-normalised
`sentence_embedding` for an embedding model, `logits` for a classifier. Pooling runs in float32
whatever the model's dtype, so fp16 embeddings differ from fp32 ones only by the encoder's error.

torch is imported when this backend is built, never by the server otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from ferry.backends.hf_folder import folder_manifest
from ferry.backends.manifest import Task
from ferry.backends.options import TorchDType, TorchOptions
from ferry.backends.placement import Device, torch_device
from ferry.backends.torch_graphs import CudaGraphs
from ferry.batcher.padding import PaddedBatch

logger = logging.getLogger(__name__)

WARMUP_SHAPES = ((1, 8), (4, 32), (8, 64))
# On a GPU a second batch's host work (copies, kernel launches) overlaps the first's compute.
CUDA_CONCURRENCY = 2
# CUDA graphs are captured for batches of up to this many rows (torch_graphs.py).
GRAPH_MAX_ROWS = 128
_IMPORT_LOCK = threading.Lock()


class TorchBackend:
    name = "torch"
    queues_batches = False  # not measured: each batch waits for a free runner in the loop

    def __init__(
        self,
        model_dir: Path,
        task: Task = "embedding",
        device: Device = "auto",
        dtype: TorchDType = "auto",
        compile: bool = False,
        allow_cpu_fallback: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        self.model_dir = model_dir
        self.task = task
        self._device_setting = device
        self._dtype_setting = dtype
        self._compile = compile
        self._allow_cpu_fallback = allow_cpu_fallback
        self._cuda_graphs = cuda_graphs
        self._graphs: dict[Any, CudaGraphs] = {}  # by stream
        self.takes_token_types = True  # transformers' encoders all accept token_type_ids
        self.output_names: tuple[str, ...] = (
            ("last_hidden_state", "sentence_embedding") if task == "embedding" else ("logits",)
        )
        self.sequence_outputs = (
            frozenset({"last_hidden_state"}) if task == "embedding" else frozenset()
        )
        self.max_concurrency = 1
        self.device = "cpu"
        self.dtype_name = "float32"
        self._model: Any = None
        self._streams: asyncio.Queue[Any] = asyncio.Queue()  # torch.cuda.Stream | None
        self._executor: ThreadPoolExecutor | None = None
        self._ready = False

    @classmethod
    def from_options(cls, path: Path, options: TorchOptions) -> TorchBackend:
        return cls(
            path,
            folder_manifest(path).task,
            device=options.device,
            dtype=options.dtype,
            compile=options.compile,
            allow_cpu_fallback=options.allow_cpu_fallback,
            cuda_graphs=options.cuda_graphs,
        )

    async def start(self) -> None:
        import torch

        self.device = torch_device(
            self._device_setting,
            torch.cuda.is_available(),
            self._allow_cpu_fallback,
            str(self.model_dir),
        )
        on_cuda = self.device == "cuda"
        self.dtype_name = (
            ("float16" if on_cuda else "float32")
            if self._dtype_setting == "auto"
            else self._dtype_setting
        )
        # A compiled model runs one batch at a time: Dynamo may recompile for a new shape, and
        # compiling is not safe from two threads at once.
        self.max_concurrency = CUDA_CONCURRENCY if on_cuda and not self._compile else 1
        self._executor = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="torch")
        loop = asyncio.get_running_loop()
        self._model = await loop.run_in_executor(self._executor, self._load)
        for _ in range(self.max_concurrency):
            # One CUDA stream per concurrent batch, so that two batches really overlap.
            stream = torch.cuda.Stream() if on_cuda else None  # type: ignore[no-untyped-call]  # unannotated in torch
            if self._cuda_graphs and on_cuda:
                self._graphs[stream] = CudaGraphs(
                    self._all_outputs, self.device, stream, GRAPH_MAX_ROWS, self._max_length()
                )
            self._streams.put_nowait(stream)
        if self._cuda_graphs and not on_cuda:
            logger.warning("torch: %s runs on the CPU: cuda_graphs has no effect", self.model_dir)
        for batch, length in WARMUP_SHAPES:  # and, with compile, the first compilations
            ids = np.ones((batch, length), dtype=np.int64)
            await self.infer(PaddedBatch(ids, ids, (length,) * batch))
        self._ready = True
        logger.info(
            "torch: %s ready on %s (%s, compile=%s, cuda_graphs=%s)",
            self.model_dir,
            self.device,
            self.dtype_name,
            self._compile,
            bool(self._graphs),
        )

    def _load(self) -> Any:
        import torch

        with _IMPORT_LOCK:  # transformers' lazy imports race when two models load at once
            from transformers import AutoModel, AutoModelForSequenceClassification
            from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers; a progress bar per load in the server's log
        loader = AutoModel if self.task == "embedding" else AutoModelForSequenceClassification
        model = loader.from_pretrained(
            str(self.model_dir), attn_implementation="sdpa", dtype=getattr(torch, self.dtype_name)
        )
        model = model.to(self.device).eval()
        if self._compile:
            # Dynamic shapes: every batch has its own (size, length); no recompile per shape.
            model = torch.compile(model, dynamic=True)
        return model

    def _max_length(self) -> int:
        positions = getattr(self._model.config, "max_position_embeddings", 512)
        return int(min(positions, 512))

    def _all_outputs(self, ids: Any, mask: Any, types: Any) -> dict[str, Any]:
        """Every output of the task for device tensors: what eager runs and graphs capture."""
        import torch

        out = self._model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        if self.task != "embedding":  # a classifier's or a cross-encoder's head
            return {"logits": out.logits.float()}
        hidden = out.last_hidden_state.float()
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
        return {"last_hidden_state": hidden, "sentence_embedding": pooled}

    def _forward(self, batch: PaddedBatch, stream: Any) -> dict[str, np.ndarray]:
        import torch

        names = batch.outputs or self.output_names
        types_np = (
            np.zeros_like(batch.input_ids) if batch.token_type_ids is None else batch.token_type_ids
        )
        with torch.inference_mode(), torch.cuda.stream(stream) if stream else nullcontext():
            graphs = self._graphs.get(stream)
            results = None
            if graphs is not None:
                results = graphs.run(batch.input_ids, batch.attention_mask, types_np)
            if results is None:  # eager: no graphs, or past the largest bucket
                ids, mask, types = (
                    torch.from_numpy(a).to(self.device, non_blocking=True)
                    for a in (batch.input_ids, batch.attention_mask, types_np)
                )
                results = self._all_outputs(ids, mask, types)
            # Only what the batch asked for leaves the device: the hidden states of a batch of
            # 128 x 128 tokens are 25 MB, 4.4 of a 5.7 ms step on an H100 when always copied.
            # .cpu() waits for this stream's work only.
            return {name: results[name].cpu().numpy() for name in names}

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        stream = await self._streams.get()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self._forward, batch, stream)
        finally:
            self._streams.put_nowait(stream)

    async def health(self) -> bool:
        return self._ready

    async def close(self) -> None:
        self._ready = False
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._model = None
