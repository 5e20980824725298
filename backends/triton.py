"""Triton Inference Server backend over tritonclient's asyncio HTTP or gRPC client.

Two modes:
- `batch`: Ferry's micro-batcher forms the padded batch; one Triton request per batch.
- `passthrough`: each row of the batch is sent unpadded as its own concurrent request, so
  Triton's dynamic batcher (not Ferry's) decides what runs together. The split happens here,
  not in the batcher, so the batcher, metrics and error paths stay identical in both modes;
  Ferry's own window then only adds its (short) queue delay.

Triton failures map onto Ferry's backend errors (`backends/errors.py`): unreachable, unknown
or unloaded model -> BackendUnavailable, invalid argument -> BackendRejected, deadline ->
BackendTimeout. Anything else (e.g. the model raising) is left as is, so the batcher retries
the batch's members alone and fails only the one that breaks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import aiohttp
import numpy as np
from tritonclient.utils import InferenceServerException

from ferry.backends.errors import BackendRejected, BackendTimeout, BackendUnavailable
from ferry.backends.options import TritonMode, TritonOptions, TritonProtocol
from ferry.batcher.padding import PaddedBatch, stack_rows

T = TypeVar("T")

logger = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask")
HEALTH_TIMEOUT_S = 2.0
START_POLL_S = 0.25
# gRPC channels back off up to 120 s between reconnects by default; capped so that Ferry notices
# a restarted Triton within about a second.
GRPC_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# Status codes of tritonclient's exceptions: HTTP codes as text, or gRPC `StatusCode.X`.
UNAVAILABLE = {"404", "502", "503", "StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND"}
REJECTED = {"400", "StatusCode.INVALID_ARGUMENT", "StatusCode.OUT_OF_RANGE"}
TIMED_OUT = {"408", "504", "StatusCode.DEADLINE_EXCEEDED"}


@dataclass(frozen=True)
class TritonTarget:
    url: str
    protocol: TritonProtocol
    model: str
    version: str = ""

    def describe(self) -> str:
        version = f" version {self.version}" if self.version else ""
        return f"Triton model {self.model!r}{version} at {self.protocol}://{self.url}"


def map_error(exc: BaseException, target: TritonTarget) -> BaseException:
    """A tritonclient / transport failure as the Ferry backend error it amounts to."""
    where = target.describe()
    if isinstance(exc, InferenceServerException):
        status = str(exc.status())
        message = exc.message() or str(exc)
        if status in UNAVAILABLE:
            return BackendUnavailable(f"{where} is unavailable: {message}")
        if status in REJECTED:
            return BackendRejected(f"{where} rejected the batch: {message}")
        if status in TIMED_OUT:
            return BackendTimeout(f"{where} timed out: {message}")
        return cast(BaseException, exc)  # narrowed to tritonclient's untyped class
    if isinstance(exc, TimeoutError):
        return BackendTimeout(f"{where} did not answer in time")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return BackendUnavailable(f"{where} cannot be reached: {exc}")
    return exc


@dataclass(eq=False)  # a backend is one connection: compared and hashed by identity
class TritonBackend:
    # Not annotated: class attributes, not fields.
    name = "triton"
    queues_batches = False  # not measured: each batch waits for a free runner in the loop

    target: TritonTarget
    mode: TritonMode = "batch"
    timeout_s: float = 30.0
    max_concurrency: int = 2
    start_timeout_s: float = 120.0
    # Ferry's max_batch_size for the model: start() refuses a Triton model that takes fewer.
    max_batch_size: int | None = None
    # Read from the model's metadata by start().
    output_names: tuple[str, ...] = field(default=(), init=False)
    sequence_outputs: frozenset[str] = field(default=frozenset(), init=False)
    takes_token_types: bool = field(default=False, init=False)  # Ferry's exports: ids and a mask
    _client: Any = field(default=None, init=False, repr=False)
    _module: Any = field(default=None, init=False, repr=False)

    @classmethod
    def from_options(
        cls, options: TritonOptions, *, name: str, infer_timeout_s: float, max_batch_size: int
    ) -> TritonBackend:
        """`name` is Ferry's name for the model, Triton's too unless `options.model` says."""
        target = TritonTarget(
            url=options.url,
            protocol=options.protocol,
            model=options.model or name,
            version=options.model_version,
        )
        return cls(
            target,
            mode=options.mode,
            # One Triton call is one batch (or one passthrough request): it may run as long as
            # the model lets any batch run.
            timeout_s=infer_timeout_s,
            max_concurrency=options.concurrency,
            max_batch_size=max_batch_size,
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Wait (bounded) for the server and the model, then read which outputs it has."""
        self._client = self._new_client()
        try:
            async with asyncio.timeout(self.start_timeout_s):
                while not await self.health():
                    await asyncio.sleep(START_POLL_S)
        except TimeoutError:
            raise BackendUnavailable(
                f"{self.target.describe()} was not ready after {self.start_timeout_s:.0f}s"
            ) from None
        metadata, triton_max_batch = await self._call(self._read_metadata())
        if triton_max_batch < 1:
            raise ValueError(
                f"{self.target.describe()} has max_batch_size 0; Ferry needs a batch axis"
            )
        if self.mode == "batch" and (self.max_batch_size or 0) > triton_max_batch:
            raise ValueError(
                f"max_batch_size {self.max_batch_size} is larger than the "
                f"{triton_max_batch} {self.target.describe()} accepts"
            )
        outputs = metadata["outputs"]
        self.output_names = tuple(o["name"] for o in outputs)
        # Shapes include the batch axis; a variable axis right after it follows the sequence.
        self.sequence_outputs = frozenset(
            o["name"] for o in outputs if len(o["shape"]) >= 3 and int(o["shape"][1]) == -1
        )
        logger.info(
            "triton: %s ready (%s mode, outputs %s)",
            self.target.describe(),
            self.mode,
            list(self.output_names),
        )

    def _new_client(self) -> Any:
        if self.target.protocol == "grpc":
            import tritonclient.grpc.aio as module

            self._module = module
            return module.InferenceServerClient(self.target.url, channel_args=GRPC_CHANNEL_ARGS)
        import tritonclient.http.aio as module

        self._module = module
        return module.InferenceServerClient(self.target.url, conn_timeout=self.timeout_s)

    async def _read_metadata(self) -> tuple[dict[str, Any], int]:
        t = self.target
        if self.target.protocol == "grpc":
            metadata = await self._client.get_model_metadata(t.model, t.version, as_json=True)
            config = (await self._client.get_model_config(t.model, t.version, as_json=True))[
                "config"
            ]
        else:
            metadata = await self._client.get_model_metadata(t.model, t.version)
            config = await self._client.get_model_config(t.model, t.version)
        return metadata, int(config.get("max_batch_size", 0))

    async def health(self) -> bool:
        """Triton's server readiness and the model's, both within a short bound."""
        if self._client is None:
            return False
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                return bool(
                    await self._client.is_server_ready()
                    and await self._client.is_model_ready(self.target.model, self.target.version)
                )
        except (InferenceServerException, aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    # -- inference --------------------------------------------------------------------------

    async def infer(self, batch: PaddedBatch) -> dict[str, np.ndarray]:
        if self._client is None:
            raise BackendUnavailable(f"{self.target.describe()}: backend is closed")
        names = batch.outputs or self.output_names
        if self.mode == "batch":
            return await self._call(
                self._infer_arrays(batch.input_ids, batch.attention_mask, names)
            )
        rows = await asyncio.gather(
            *(
                self._call(
                    self._infer_arrays(
                        batch.input_ids[i : i + 1, :length],
                        batch.attention_mask[i : i + 1, :length],
                        names,
                    )
                )
                for i, length in enumerate(batch.lengths)
            )
        )
        return self._stack_rows(rows, batch.padded_length, names)

    def _stack_rows(
        self, rows: list[dict[str, np.ndarray]], width: int, names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """One-row results back into a batch; sequence outputs re-padded for the batcher."""
        return {
            name: stack_rows(
                [row[name][0] for row in rows], width if name in self.sequence_outputs else None
            )
            for name in names
        }

    async def _infer_arrays(
        self, ids: np.ndarray, mask: np.ndarray, names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        m = self._module
        inputs = []
        for name, value in zip(INPUTS, (ids, mask), strict=True):
            tensor = m.InferInput(name, list(value.shape), "INT64")
            tensor.set_data_from_numpy(np.ascontiguousarray(value))
            inputs.append(tensor)
        # HTTP would answer in JSON unless each output asks for binary data.
        outputs = [m.InferRequestedOutput(name) for name in names]
        result = await self._client.infer(
            self.target.model, inputs, model_version=self.target.version, outputs=outputs
        )
        return {name: result.as_numpy(name) for name in names}

    async def _call(self, coroutine: Awaitable[T]) -> T:
        """Await one Triton call under the request timeout, its failures mapped to Ferry's."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await coroutine
        except (InferenceServerException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            mapped = map_error(exc, self.target)
            if mapped is exc:
                raise
            raise mapped from exc
