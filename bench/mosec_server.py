"""The Mosec peer: Mosec's dynamic batcher (in its Rust front end) in front of one ONNX Runtime
session.

Configured as Mosec's README has it: one `Worker` process appended with `max_batch_size` and
`max_wait_time` (ms), whose `forward` receives the batch as a list and returns one answer per
item in order; its session uses every core. Bodies are decoded and answers encoded with msgspec
(Mosec's own dependency, which its typed mixins use) instead of the default indented
`json.dumps`. A bad body is Mosec's `ValidationError` (422) raised while its batch is decoded:
in Mosec an error fails the whole batch it is in. Body and answer are Ferry's /predict ones.

python -m ferry.bench.mosec_server --model PATH [--port 8020] [--max-batch-size 32]
    [--wait-ms 5] [--threads N]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec
from mosec import Server, ValidationError, Worker

from ferry.bench.batched_peer import TIMEOUT_S, PaddedEncoder, parse_args

# How the worker process (started by Mosec with `spawn`) learns what to load.
MODEL_ENV = "FERRY_PEER_MODEL"
THREADS_ENV = "FERRY_PEER_THREADS"


class PredictBody(msgspec.Struct):
    input_ids: Annotated[list[int], msgspec.Meta(min_length=1)]


class Encoder(Worker):
    decoder = msgspec.json.Decoder(PredictBody)

    def __init__(self) -> None:
        super().__init__()
        self.encoder = PaddedEncoder(Path(os.environ[MODEL_ENV]), int(os.environ[THREADS_ENV]))

    def deserialize(self, data: bytes) -> list[int]:
        try:
            return self.decoder.decode(data).input_ids
        except msgspec.DecodeError as exc:  # ValidationError is one, naming the field
            raise ValidationError(str(exc)) from exc

    def forward(self, data: Any) -> Any:  # Mosec reads these hints for its OpenAPI schema
        # Mosec hands a batching worker a list, and one without batching the item itself.
        rows = data if self.max_batch_size > 1 else [data]
        embeddings = self.encoder.embed(rows)
        answers = [self.encoder.answer(ids, row) for ids, row in zip(rows, embeddings, strict=True)]
        return answers if self.max_batch_size > 1 else answers[0]

    def serialize(self, data: dict) -> bytes:
        return msgspec.json.encode(data)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.split("\n\n")[0], argv)
    os.environ[MODEL_ENV], os.environ[THREADS_ENV] = str(args.model), str(args.threads)
    # Mosec reads its own options from the command line: give it only those.
    sys.argv = [sys.argv[0], "--address", args.host, "--port", str(args.port)]
    sys.argv += ["--timeout", str(TIMEOUT_S * 1000), "--log-level", "warning"]
    server = Server()
    server.append_worker(
        Encoder,
        num=1,
        max_batch_size=args.max_batch_size,
        max_wait_time=args.wait_ms,
        route="/predict",
    )
    server.run()


if __name__ == "__main__":
    main()
