"""The sequence batcher (server/sequences.py) in this process, with a clock of its own: the
controls and implicit state it fills, the order it keeps, its slots and backlog, idle expiry,
and Triton's wording for requests it refuses; and the KServe sequence parameters."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np
import pytest

from ferry.backends.tensor_signature import Signature, TensorSpec
from ferry.batcher import DeadlineExceeded
from ferry.server.errors import InvalidInput
from ferry.server.kserve.infer import ABSENT
from ferry.server.kserve.sequence_parameters import sequence_flags
from ferry.server.sequences import SequenceBatcher, SequenceFlags
from ferry.server.settings import SequenceBatching

pytestmark = pytest.mark.unit

CONTROLS = {"START": "start", "END": "end", "READY": "ready", "CORRID": "corrid"}


def graph(corrid: str = "UINT64") -> Signature:
    flags = [TensorSpec(n, "INT32", ("batch", 1)) for n in ("START", "END", "READY")]
    return Signature(
        (
            TensorSpec("INPUT", "INT32", ("batch", 1)),
            *flags,
            TensorSpec("CORRID", corrid, ("batch", 1)),
            TensorSpec("STATE_IN", "INT32", ("batch", 1)),
        ),
        (
            TensorSpec("OUTPUT", "INT32", ("batch", 1)),
            TensorSpec("STATE_OUT", "INT32", ("batch", 1)),
        ),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Accumulator:
    """A stand-in graph: OUTPUT = INPUT + the state (0 at START); every call's inputs kept."""

    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []
        self.gates: dict[int, asyncio.Event] = {}  # by INPUT value: held until set

    async def __call__(
        self, tensors: Mapping[str, np.ndarray], outputs: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        value = int(tensors["INPUT"][0, 0])
        if value in self.gates:
            await self.gates[value].wait()
        self.calls.append(dict(tensors))
        total = tensors["INPUT"] + tensors["STATE_IN"] * (1 - tensors["START"])
        assert set(outputs) == {"OUTPUT", "STATE_OUT"}
        return {"OUTPUT": total, "STATE_OUT": total}


def batcher(slots: int = 4, corrid: str = "UINT64", clock: Clock | None = None, **settings):
    config = SequenceBatching(
        controls=CONTROLS,
        state=[{"input": "STATE_IN", "output": "STATE_OUT"}],
        **settings,
    )
    return SequenceBatcher("acc", config, graph(corrid), slots, clock or Clock())


def value(number: int) -> dict[str, np.ndarray]:
    return {"INPUT": np.array([[number]], dtype=np.int32)}


async def settle(turns: int = 200) -> None:
    """Lets every task that can run do so: loop turns, not wall time (a sleep of 10 ms could
    end before they had, on a loaded machine)."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def step(sequences, model, flags, number, timeout_s=5.0):
    turn = sequences.admit(flags)
    result = await sequences.run(turn, value(number), ("OUTPUT",), timeout_s, model)
    return int(result["OUTPUT"][0, 0])


async def test_controls_and_state_are_filled_as_tritons_sequence_batcher_fills_them():
    sequences, model = batcher(), Accumulator()
    answers = [
        await step(sequences, model, SequenceFlags(1000, start=True), 5),
        await step(sequences, model, SequenceFlags(1000), 7),
        await step(sequences, model, SequenceFlags(1000, end=True), 2),
    ]
    assert answers == [5, 12, 14]
    columns = {n: [int(c[n][0, 0]) for c in model.calls] for n in (*CONTROLS, "STATE_IN")}
    assert columns == {
        "START": [1, 0, 0],
        "END": [0, 0, 1],
        "READY": [1, 1, 1],
        "CORRID": [1000, 1000, 1000],
        "STATE_IN": [0, 5, 12],
    }
    first = model.calls[0]
    assert first["CORRID"].dtype == np.uint64 and first["START"].dtype == np.int32
    assert all(t.shape == (1, 1) for t in first.values())


async def test_a_string_id_fills_a_bytes_corrid():
    sequences, model = batcher(corrid="BYTES"), Accumulator()
    await step(sequences, model, SequenceFlags("1002", start=True), 1)
    assert model.calls[0]["CORRID"].tolist() == [["1002"]]


async def test_a_sequences_requests_run_in_arrival_order_and_sequences_do_not_mix():
    sequences, model = batcher(), Accumulator()
    model.gates[1] = asyncio.Event()  # the first request of sequence 7 is slow
    arrivals = [
        (SequenceFlags(7, start=True), 1),
        (SequenceFlags(8, start=True), 100),
        (SequenceFlags(7), 2),
        (SequenceFlags(8), 200),
        (SequenceFlags(7, end=True), 3),
        (SequenceFlags(8, end=True), 300),
    ]
    turns = [(sequences.admit(flags), number) for flags, number in arrivals]
    tasks = [
        asyncio.create_task(sequences.run(t, value(n), ("OUTPUT",), 5.0, model))
        for t, n in reversed(turns)  # started in the opposite order
    ]
    await settle()
    assert [int(c["INPUT"][0, 0]) for c in model.calls] == [100, 200, 300]  # 8 did not wait
    model.gates[1].set()
    results = [int(r["OUTPUT"][0, 0]) for r in reversed(await asyncio.gather(*tasks))]
    assert results == [1, 100, 3, 300, 6, 600]


async def test_a_cancelled_request_lets_the_next_one_run():
    sequences, model = batcher(), Accumulator()
    model.gates[1] = asyncio.Event()
    first = sequences.admit(SequenceFlags(3, start=True))
    second = sequences.admit(SequenceFlags(3, end=True))
    slow = asyncio.create_task(sequences.run(first, value(1), ("OUTPUT",), 5.0, model))
    await asyncio.sleep(0)
    slow.cancel()
    result = await sequences.run(second, value(4), ("OUTPUT",), 5.0, model)
    assert int(result["OUTPUT"][0, 0]) == 4  # no state: the first never finished


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (None, "inference request to model 'acc' must specify a non-zero or non-empty "),
        (
            SequenceFlags(5),
            "inference request for sequence 5 to model 'acc' must specify the START flag on "
            "the first request of the sequence",
        ),
        (SequenceFlags("5", start=True), "correlation ID in request is not an unsigned int"),
    ],
)
def test_requests_outside_a_started_sequence_are_refused_with_tritons_wording(flags, message):
    with pytest.raises(InvalidInput, match=message) as refused:
        batcher().admit(flags)
    assert refused.value.field == "sequence_id"


def test_an_integer_id_for_a_bytes_corrid_is_refused():
    with pytest.raises(InvalidInput, match="correlation ID in request is not a string"):
        batcher(corrid="BYTES").admit(SequenceFlags(5, start=True))


async def test_a_sequence_ends_at_its_end_request():
    sequences, model = batcher(), Accumulator()
    await step(sequences, model, SequenceFlags(9, start=True, end=True), 1)
    with pytest.raises(InvalidInput, match="must specify the START flag"):
        sequences.admit(SequenceFlags(9))
    assert sequences.in_progress == 0


async def test_an_idle_sequence_is_ended_and_its_next_request_refused():
    clock = Clock()
    sequences, model = batcher(clock=clock, max_sequence_idle_s=2.0), Accumulator()
    await step(sequences, model, SequenceFlags(4, start=True), 1)
    clock.now = 1.9
    await step(sequences, model, SequenceFlags(4), 1)  # within the idle time: goes on
    clock.now = 4.0
    with pytest.raises(InvalidInput, match=r"sequence 4 .* must specify the START flag"):
        sequences.admit(SequenceFlags(4))


async def test_a_new_sequence_past_the_slots_waits_for_one_to_end():
    sequences, model = batcher(slots=1), Accumulator()
    await step(sequences, model, SequenceFlags(1, start=True), 10)
    waiting = sequences.admit(SequenceFlags(2, start=True))
    task = asyncio.create_task(sequences.run(waiting, value(20), ("OUTPUT",), 5.0, model))
    await settle()
    assert not task.done() and len(model.calls) == 1  # in the backlog
    await step(sequences, model, SequenceFlags(1, end=True), 11)
    assert int((await task)["OUTPUT"][0, 0]) == 20


async def test_an_idle_sequence_gives_its_slot_to_the_backlog():
    clock = Clock()
    sequences, model = batcher(slots=1, clock=clock), Accumulator()
    await step(sequences, model, SequenceFlags(1, start=True), 10)
    waiting = sequences.admit(SequenceFlags(2, start=True))
    task = asyncio.create_task(sequences.run(waiting, value(20), ("OUTPUT",), 5.0, model))
    await settle()
    clock.now = 5.0
    sequences.expire()
    assert int((await task)["OUTPUT"][0, 0]) == 20


async def test_a_sequence_that_waits_past_its_deadline_fails_with_all_its_requests():
    sequences, model = batcher(slots=1), Accumulator()
    await step(sequences, model, SequenceFlags(1, start=True), 10)
    first = sequences.admit(SequenceFlags(2, start=True))
    second = sequences.admit(SequenceFlags(2))
    with pytest.raises(DeadlineExceeded, match="sequence slots"):
        await sequences.run(first, value(1), ("OUTPUT",), 0.05, model)
    with pytest.raises(DeadlineExceeded):
        await sequences.run(second, value(1), ("OUTPUT",), 5.0, model)
    with pytest.raises(InvalidInput, match="START"):
        sequences.admit(SequenceFlags(2))
    assert len(model.calls) == 1


# -- KServe parameters ------------------------------------------------------------------------


def parameters(**values):
    return lambda name: values.get(name, ABSENT)


@pytest.mark.parametrize(
    ("sent", "flags"),
    [
        ({}, None),
        ({"sequence_id": 0}, None),
        ({"sequence_id": ""}, None),
        ({"sequence_id": 7, "sequence_start": True}, SequenceFlags(7, start=True)),
        ({"sequence_id": "a-b", "sequence_end": True}, SequenceFlags("a-b", end=True)),
        ({"sequence_id": 2**64 - 1}, SequenceFlags(2**64 - 1)),
    ],
)
def test_sequence_parameters_are_read(sent, flags):
    assert sequence_flags(parameters(**sent)) == flags


@pytest.mark.parametrize(
    ("sent", "field"),
    [
        ({"sequence_start": True}, "sequence_id"),
        ({"sequence_id": True}, "sequence_id"),
        ({"sequence_id": -3}, "sequence_id"),
        ({"sequence_id": 2**64}, "sequence_id"),
        ({"sequence_id": 1.5}, "sequence_id"),
        ({"sequence_id": "x" * 129}, "sequence_id"),
        ({"sequence_id": 3, "sequence_end": 1}, "sequence_end"),
        ({"sequence_id": 3, "sequence_start": "yes"}, "sequence_start"),
    ],
)
def test_bad_sequence_parameters_are_refused_naming_them(sent, field):
    with pytest.raises(InvalidInput) as refused:
        sequence_flags(parameters(**sent))
    assert refused.value.field == field
