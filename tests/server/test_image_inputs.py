"""Images decoded in worker processes: one fewer than the cores by default, never in this
process, rows equal to the in-process decode, refusals naming the item across the boundary,
and a worker that dies failing only the request it held."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
from multiprocessing.connection import wait

import numpy as np
import pytest

from ferry.batcher.errors import InferenceFailed
from ferry.server import worker_cores
from ferry.server.errors import InvalidInput
from ferry.server.image_decode import decode_image
from ferry.server.image_inputs import ImageInputs
from tests.server.test_image_decode import image_plan
from tests.support import images

pytestmark = pytest.mark.integration


@pytest.fixture
def decoder():
    inputs = ImageInputs(image_plan(workers=1), "cnn", max_pending=16)
    yield inputs
    inputs.close()


def encoded_items() -> list[object]:
    jpegs = [images.encoded(index) for index in range(4)]
    pngs = [images.encoded(index, "PNG", "RGBA") for index in range(2)]
    return [*jpegs, *pngs, base64.b64encode(images.encoded(5)).decode()]


@pytest.mark.parametrize(
    ("cores", "processes", "workers"),
    [(1, 1, 1), (2, 1, 1), (8, 1, 7), (2, 2, 1), (16, 4, 3), (16, 5, 3)],
)
def test_the_default_leaves_the_loop_a_core_and_shares_the_rest(
    monkeypatch, cores, processes, workers
):
    """Each API process or replica starts its own pools: they split the cores, not each take
    them all."""
    monkeypatch.setattr(worker_cores, "available_cores", lambda: cores)
    monkeypatch.setattr(worker_cores, "_sharing", 1)  # restored after the test
    worker_cores.share_cores(processes)
    assert worker_cores.default_workers() == workers


def test_images_are_decoded_in_other_processes_as_in_this_one(decoder):
    items = encoded_items()
    rows = asyncio.run(decoder.decode(np.array(items, dtype=object)))
    expected = np.stack([decode_image(item, decoder.plan, "pixels") for item in items])
    assert rows.dtype == expected.dtype
    np.testing.assert_array_equal(rows, expected)
    assert len(decoder.pids) == decoder.workers == 1
    assert os.getpid() not in decoder.pids


def test_a_refusal_names_the_item_across_the_process_boundary(decoder):
    items = np.array([images.encoded(0), b"not an image at all"], dtype=object)
    with pytest.raises(InvalidInput) as refused:
        asyncio.run(decoder.decode(items))
    assert refused.value.field == "pixels[1]"
    assert refused.value.message == "not a JPEG or PNG image"


def test_a_dead_worker_fails_its_request_and_new_ones_decode_the_next(decoder):
    items = np.array(encoded_items(), dtype=object)
    asyncio.run(decoder.decode(items))
    [pid] = decoder.pids
    process = decoder._pool._processes[pid]
    os.kill(pid, signal.SIGKILL)
    wait([process.sentinel])
    with pytest.raises(InferenceFailed, match="image decoder stopped"):
        asyncio.run(decoder.decode(items))
    rows = asyncio.run(decoder.decode(items))
    assert len(rows) == len(items)
    assert pid not in decoder.pids
