"""One encoder serving path, shaped after TEI's `Infer::embed_pooled`.

/predict, /v1/embeddings and KServe v2 infer (HTTP and gRPC) each only parse their protocol and
render their answer; everything between happens here, once: `validate` (bounds checked before
any work, tokenizing off the loop) makes the request a `ValidSequences`, and `run` submits it
with the outputs asked for and waits unless the client leaves.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from ferry.server.disconnect import ClientDisconnected
from ferry.server.encoder_model import EncoderModel
from ferry.server.encoder_request import ValidSequences
from ferry.server.encoder_validation import EncoderValidation
from ferry.server.settings import Settings


@dataclass(frozen=True)
class EncoderResult:
    rows: list[dict[str, np.ndarray]]
    prompt_tokens: int


class EncoderServing:
    def __init__(self, settings: Settings) -> None:
        # `validate` (encoder_validation.py) makes a request a ValidSequences, checked once;
        # `run` takes only that.
        self.validate = EncoderValidation(settings).validate

    async def run(
        self,
        model: EncoderModel,
        valid: ValidSequences,
        disconnected: asyncio.Future[None] | None = None,
    ) -> EncoderResult:
        """Rows of raw outputs (at least `valid.outputs`), one per item, in order.

        Raises the batcher's errors, or ClientDisconnected.
        """
        rows = await gather_results(model.submit(valid), disconnected)
        return EncoderResult(rows, valid.tokens)


async def gather_results(
    futures: list[asyncio.Future[dict[str, np.ndarray]]], disconnected: asyncio.Future[None] | None
) -> list[dict[str, np.ndarray]]:
    """Every future's result; a client that leaves first has its queued items dropped."""

    def drop(_: object) -> None:
        for future in futures:
            future.cancel()

    if disconnected is not None:
        disconnected.add_done_callback(drop)
    try:
        if len(futures) == 1:
            return [await futures[0]]
        return list(await asyncio.gather(*futures))
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if (
            disconnected is not None
            and disconnected.done()
            and not (current and current.cancelling())
        ):
            raise ClientDisconnected() from None
        raise
    finally:
        if disconnected is not None:
            disconnected.remove_done_callback(drop)
        # After one failed, the rest are not worth running: cancelling drops them from the queue.
        drop(disconnected)
