"""What the batcher tells a tracer (batcher/tracing.py) about a traced request: its admission,
its wait, and the batch that carries it, with the batch's shape as packed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from ferry.batcher import tracing
from ferry.batcher.errors import QueueFull
from tests.batcher.manual_clock import ManualClock
from tests.batcher.test_batcher import RecordingBackend, make, seq

pytestmark = pytest.mark.unit


class Recorder:
    """A RequestTracer, QueueWait and BatchSpan at once, noting every call."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    @contextmanager
    def admission(self) -> Any:
        self.events.append("admission")
        yield

    def queued(self) -> Recorder:
        self.events.append("queued")
        return self

    def batch(self, model: str, members: Sequence[Any]) -> Recorder:
        self.events.append(("batch", model, len(members)))
        return self

    def left(self) -> None:
        self.events.append("left")

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.append("batch ended")

    def formed(self, size: int, padded_length: int, real_tokens: int, padded_tokens: int) -> None:
        self.events.append(("formed", size, padded_length, real_tokens, padded_tokens))

    @contextmanager
    def backend(self) -> Any:
        self.events.append("backend")
        yield


async def test_a_traced_request_s_admission_wait_and_batch_are_told_to_its_tracer():
    clock = ManualClock()
    backend = RecordingBackend()
    batcher = make(backend, clock, dispatch_when_idle=False)
    recorder = Recorder()
    token = tracing.current.set(recorder)
    try:
        futures = batcher.submit([seq(1, 2, 3), seq(4)])
    finally:
        tracing.current.reset(token)
    await clock.run_until_done(asyncio.gather(*futures))
    await batcher.close(1)
    events = recorder.events
    assert events[:3] == ["admission", "queued", "queued"]
    # One batch of both members: 2 rows padded to 3, 4 real tokens of 6.
    assert ("batch", "m", 2) in events and ("formed", 2, 3, 4, 6) in events
    assert events.index(("formed", 2, 3, 4, 6)) < events.index("backend")


async def test_a_refusal_under_a_tracer_is_the_same_refusal():
    clock = ManualClock()
    batcher = make(RecordingBackend(asyncio.Event()), clock, max_queue_size=1)
    token = tracing.current.set(Recorder())
    try:
        batcher.submit([seq(1)])
        with pytest.raises(QueueFull):
            batcher.submit([seq(2), seq(3)])
    finally:
        tracing.current.reset(token)
    await batcher.close(0)
