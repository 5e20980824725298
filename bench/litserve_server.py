"""The LitServe peer: LitServe's own dynamic batcher in front of one ONNX Runtime session.

Configured as LitServe's docs and its own benchmark servers have it: batching set on the
`LitAPI` (`max_batch_size`, `batch_timeout`), `batch` pads the decoded requests into one
model input and `unbatch` splits the output into rows; one inference worker on the CPU
(`workers_per_device=1`) whose session uses every core; one API server process; ZeroMQ between
them (`fast_queue=True`, "for > 100 RPS"). The body is checked by FastAPI against a pydantic
model in the API server, before it is queued (a bad one is a 422 and never joins a batch).
Body and answer are Ferry's /predict ones.

python -m ferry.bench.litserve_server --model PATH [--port 8020] [--max-batch-size 32]
    [--wait-ms 5] [--threads N]
"""

import signal
from pathlib import Path
from typing import Annotated

import litserve as ls
import litserve.server as ls_server
import numpy as np
from pydantic import BaseModel, Field, StrictInt

from ferry.bench.batched_peer import TIMEOUT_S, PaddedEncoder, pad_rows, parse_args

# The requests' token ids, and the model's feeds padded to the longest of them.
Padded = tuple[list[list[int]], dict[str, np.ndarray]]


# decode_request's annotation is what FastAPI parses the body into (so no postponed
# annotations in this module: LitServe reads the annotation as an object).
class PredictBody(BaseModel):
    input_ids: Annotated[list[StrictInt], Field(min_length=1)]


class EncoderAPI(ls.LitAPI):
    def __init__(self, model: Path, threads: int, max_batch_size: int, wait_ms: int) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=wait_ms / 1000)
        self.model, self.threads = model, threads

    def setup(self, device: str) -> None:
        self.encoder = PaddedEncoder(self.model, self.threads)

    def decode_request(self, request: PredictBody) -> list[int]:
        return request.input_ids

    def batch(self, inputs: list[list[int]]) -> Padded:
        return inputs, pad_rows(inputs)

    def predict(self, batch: Padded) -> tuple[list[list[int]], np.ndarray]:
        rows, feeds = batch
        return rows, self.encoder.run(feeds)

    def unbatch(self, output: tuple[list[list[int]], np.ndarray]) -> list:
        rows, embeddings = output
        return list(zip(rows, embeddings, strict=True))

    # No return annotation: LitServe would make it FastAPI's response model and validate every
    # answer against it; LitServe's examples leave it out (FastAPI then encodes the dict).
    def encode_response(self, output: tuple[list[int], np.ndarray]):
        return self.encoder.answer(*output)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.split("\n\n")[0], argv)
    api = EncoderAPI(args.model, args.threads, args.max_batch_size, args.wait_ms)
    server = ls.LitServer(
        api, accelerator="cpu", devices=1, workers_per_device=1, timeout=TIMEOUT_S, fast_queue=True
    )
    # LitServe shuts its workers down on KeyboardInterrupt only; a SIGTERM would orphan them.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # LitServe 0.2.19 mounts its MCP routes when `mcp` is importable but defines them only when
    # `fastmcp` is: beside `mcp` alone (openai-agents' dependency, in the test venv) its server
    # dies at start (NameError: MCPServer). This peer serves no MCP tools, so it is switched off.
    ls_server._MCP_AVAILABLE = False
    server.run(
        host=args.host,
        port=args.port,
        num_api_servers=1,
        log_level="warning",
        generate_client_file=False,
        access_log=False,
    )


if __name__ == "__main__":
    main()
