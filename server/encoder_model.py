"""What the server uses of an encoder model: the routes, the encoder path, KServe and the registry
see only this. `ModelRuntime` (model_runtime.py) runs the model in this process; in an API process
`RemoteModelRuntime` (procs/remote.py) forwards to the engine process's."""

from __future__ import annotations

import asyncio
from typing import Protocol

from ferry.backends.manifest import ModelManifest
from ferry.batcher.types import Result
from ferry.server.encoder_request import ValidSequences
from ferry.server.model_outputs import BackendInfo, ModelOutputs
from ferry.server.served_model import ServedModel
from ferry.server.tokenization import TextTokenizer


class EncoderModel(ServedModel, Protocol):
    @property
    def manifest(self) -> ModelManifest: ...
    @property
    def tokenizer(self) -> TextTokenizer: ...
    @property
    def backend(self) -> BackendInfo: ...
    @property
    def outputs(self) -> ModelOutputs: ...

    def check_deadline(self, longest: int, timeout_s: float) -> None:
        """Raises InvalidInput (timeout_ms) for a deadline the model can never meet."""

    def submit(self, valid: ValidSequences) -> list[asyncio.Future[Result]]:
        """Queue a validated request's rows (nothing is checked again), one future each."""
