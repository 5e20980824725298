"""A batch of large tensors is stacked in a worker thread, not on the event loop that every
other request and probe waits for (batcher/packing.py, OFF_LOOP_BYTES); a small one in place,
where a thread hop would cost more than the copy."""

import asyncio
import threading

import numpy as np
import pytest

from ferry.batcher import BatchLimits, MicroBatcher, packing
from ferry.batcher.packing import OFF_LOOP_BYTES, TensorPacking
from ferry.batcher.tensor_padding import TensorBatch, TensorLayout, TensorRows

pytestmark = pytest.mark.unit


def member(value: float, width: int) -> TensorRows:
    return TensorRows({"x": np.full((1, width), value, np.float32)}, 1, {})


@pytest.mark.parametrize(
    ("width", "off_loop"),
    [(8, False), (OFF_LOOP_BYTES // 4, True)],  # float32: two members of half the bytes each
    ids=["small-in-place", "large-in-a-thread"],
)
async def test_a_large_batch_is_stacked_off_the_event_loop(monkeypatch, width, off_loop):
    stacked_in: list[int] = []
    pad_tensors = packing.pad_tensors

    def recording(*args, **kwargs):
        stacked_in.append(threading.get_ident())
        return pad_tensors(*args, **kwargs)

    monkeypatch.setattr(packing, "pad_tensors", recording)
    sizes: list[int] = []
    asked: list[tuple[str, ...] | None] = []

    async def infer(batch: TensorBatch) -> dict[str, np.ndarray]:
        sizes.append(batch.size)
        asked.append(batch.outputs)
        return {"y": batch.inputs["x"].sum(axis=1, keepdims=True)}

    batcher = MicroBatcher(
        "m",
        infer,
        BatchLimits(max_batch_tokens=2**20, max_queue_delay_s=0.05, dispatch_when_idle=False),
        None,
        packing=TensorPacking(TensorLayout(inputs={"x": {}})),
    )
    batcher.start()
    # Stacked in either place, the batch carries the outputs its members asked for.
    futures = batcher.submit([member(1.0, width), member(2.0, width)], outputs=frozenset({"y"}))
    answers = await asyncio.gather(*futures)
    await batcher.close(1)
    assert sizes == [2]  # one batch of both, so that it was stacked
    assert asked == [("y",)]
    assert [a["y"].item() for a in answers] == [width * 1.0, width * 2.0]
    assert (stacked_in[0] != threading.get_ident()) is off_loop
