"""Rows that answer several clients' requests (a loop turn's plain requests queued together,
server/kserve/turn_groups.py) count as that many requests: in the queue's bound, its depth,
and what leaving it gives back."""

import asyncio

import numpy as np
import pytest

from ferry.batcher import BatchLimits, MicroBatcher, QueueFull
from ferry.batcher.packing import TensorPacking
from ferry.batcher.tensor_padding import TensorBatch, TensorLayout, TensorRows
from tests.batcher.manual_clock import ManualClock
from tests.batcher.test_batcher_observer import RecordingObserver

pytestmark = pytest.mark.unit


def rows(count: int, requests: int) -> TensorRows:
    return TensorRows({"x": np.zeros((count, 2), np.float32)}, count, {}, requests=requests)


async def test_rows_of_several_requests_count_each_in_the_queue():
    async def infer(batch: TensorBatch) -> dict[str, np.ndarray]:
        return {"y": batch.inputs["x"]}

    limits = BatchLimits(max_queue_size=5, dispatch_when_idle=False, max_queue_delay_s=60)
    batcher = MicroBatcher("m", infer, limits, None, packing=TensorPacking(TensorLayout({"x": {}})))
    batcher.start()
    group = batcher.submit([rows(3, requests=3)])
    assert batcher.queue_depth == 3
    with pytest.raises(QueueFull):  # 3 + 3 requests: past the 5 the queue holds
        batcher.submit([rows(3, requests=3)])
    alone = batcher.submit([rows(2, requests=1), rows(1, requests=1)])
    assert batcher.queue_depth == 5
    group[0].cancel()  # its clients left: their places come back
    await asyncio.sleep(0)
    assert batcher.queue_depth == 2
    for future in alone:
        future.cancel()
    await asyncio.sleep(0)
    assert batcher.queue_depth == 0
    await batcher.close(0)


async def test_a_batch_reports_each_request_its_rows_answer():
    clock = ManualClock()
    observer = RecordingObserver()

    async def infer(batch: TensorBatch) -> dict[str, np.ndarray]:
        return {"y": batch.inputs["x"]}

    limits = BatchLimits(dispatch_when_idle=False, max_queue_delay_s=0.01)
    layout = TensorLayout({"x": {}})
    batcher = MicroBatcher(
        "m", infer, limits, None, packing=TensorPacking(layout), observer=observer, clock=clock
    )
    batcher.start()
    futures = batcher.submit([rows(3, requests=3)])
    await clock.advance(0.005)
    futures += batcher.submit([rows(1, requests=1)])
    await clock.run_until_done(asyncio.gather(*futures))
    size, _, _, waits, batch_rows = observer.formed[0]
    assert (size, batch_rows) == (4, 4)  # four requests, as four rows of one each would be
    assert waits == pytest.approx([0.01] * 3 + [0.005])
    await batcher.close(0)
