"""bench.shm's requests: the same image by binary HTTP (the tensor in the body) and by shared
memory (only a header naming the regions), and its report's ratios."""

from __future__ import annotations

import json

import pytest

from ferry.bench import shm

pytestmark = pytest.mark.unit


def test_binary_carries_the_image_and_shared_memory_only_names_it():
    array = shm.image()
    body, headers = shm.binary_request(array)
    head = int(headers[shm.HEADER_LENGTH])
    assert body[head:] == array.tobytes() and len(body) - head == shm.IMAGE_BYTES
    named, _ = shm.shm_request("in", "out")
    assert len(named) < 1000
    (tensor,) = json.loads(named)["inputs"]
    assert tensor["shape"] == shm.SHAPE
    assert tensor["parameters"] == {
        "shared_memory_region": "in",
        "shared_memory_byte_size": shm.IMAGE_BYTES,
    }


def test_report_gives_the_ratios():
    results = {
        "binary HTTP": shm.Result([0.02] * 50, 1.0),
        "shared memory": shm.Result([0.01] * 100, 1.0),
    }
    assert "req/s 2.00x, p50 0.50x" in shm.report(results, 2)
