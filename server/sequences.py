"""Triton's sequence batcher for a stateful plain graph (Triton's `sequence_batching`).

A request names its sequence (`sequence_id`, an integer or a string) and marks the sequence's
first and last requests (`sequence_start`, `sequence_end`). The requests of one sequence run one
at a time, in the order they arrived; those of different sequences share batches as any rows
do. For each request the server fills the graph's control inputs (START, END, READY, CORRID, as
Triton's sequence batcher fills them: 1 or 0, and the id) and its implicit state (the state
output of the sequence's previous request), so clients send only the model's own inputs.

How many sequences may be in progress at once is bounded (the strategy's slots); a new sequence
past that waits, with all its requests, until one ends or idles out (Triton's backlog). A
sequence with no request for `max_sequence_idle_s` is ended: its next request is refused as one
that did not START, with Triton's wording.

`admit` runs synchronously where the request arrives, so requests keep their arrival order
(the gRPC stream relies on it: server/kserve/grpc_service.py); `run` then waits for the
request's turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ferry.backends.tensor_signature import Signature, TensorSpec
from ferry.batcher import DeadlineExceeded
from ferry.server.errors import InvalidInput
from ferry.server.settings import SequenceBatching

logger = logging.getLogger(__name__)

SEQUENCE_ID = "sequence_id"
MAX_ID_CHARS = 128  # Triton's bound on a string correlation ID
MAX_ID = 2**64 - 1  # an integer id is Triton's uint64


@dataclass(frozen=True)
class SequenceFlags:
    """A request's place in its sequence, checked (server/kserve/sequence_parameters.py)."""

    id: int | str
    start: bool = False
    end: bool = False

    @property
    def key(self) -> tuple[type, int | str]:
        """Its sequence: 7 and "7" are two (as Triton's correlation IDs of two types are)."""
        return type(self.id), self.id


@dataclass(eq=False)
class _Sequence:
    id: int | str
    slot: asyncio.Future[None]  # done once it holds a slot (at once, or out of the backlog)
    last_used: float
    tail: asyncio.Future[None] | None = None  # done when its latest admitted request is
    state: dict[str, np.ndarray] = field(default_factory=dict)  # by state input
    in_flight: int = 0
    holds_slot: bool = False
    failed: BaseException | None = None  # it never got a slot: its requests fail with this


@dataclass(eq=False)
class Turn:
    """One admitted request: it runs once `previous` (its sequence's request before it) is done."""

    sequence: _Sequence
    start: bool
    end: bool
    previous: asyncio.Future[None] | None
    done: asyncio.Future[None]


class _Slots:
    """The sequences that may be in progress at once; the rest wait in arrival order."""

    def __init__(self, count: int) -> None:
        self.free = count
        self._waiting: deque[_Sequence] = deque()

    def reserve(self, sequence: _Sequence) -> None:
        if self.free:
            self.free -= 1
            sequence.holds_slot = True
            sequence.slot.set_result(None)
        else:
            self._waiting.append(sequence)

    def release(self, sequence: _Sequence) -> None:
        if not sequence.holds_slot:
            with contextlib.suppress(ValueError):
                self._waiting.remove(sequence)
            return
        sequence.holds_slot = False
        if self._waiting:
            following = self._waiting.popleft()
            following.holds_slot = True
            following.slot.set_result(None)
        else:
            self.free += 1

    @property
    def backlog(self) -> int:
        return len(self._waiting)


InferFn = Callable[[Mapping[str, np.ndarray], tuple[str, ...]], Awaitable[dict[str, np.ndarray]]]


class SequenceBatcher:
    """The sequences of one model: their order, slots, control inputs and implicit state."""

    def __init__(
        self,
        model: str,
        settings: SequenceBatching,
        graph: Signature,
        slots: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.settings = settings
        self.slots = slots
        self._clock = clock
        self._controls = {name: graph.input(name) for name in settings.controls}
        self._state_inputs = {s.input: graph.input(s.input) for s in settings.state}
        self.state_outputs = tuple(s.output for s in settings.state)
        corrid = [n for n, kind in settings.controls.items() if kind == "corrid"]
        self._corrid: TensorSpec | None = self._controls[corrid[0]] if corrid else None
        self._live: dict[tuple[type, int | str], _Sequence] = {}
        self._slots = _Slots(slots)
        self._reaper: asyncio.Task[None] | None = None

    @property
    def filled_inputs(self) -> frozenset[str]:
        """The graph inputs the server fills (clients neither see nor send them)."""
        return frozenset({*self._controls, *self._state_inputs})

    def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap(), name=f"sequences {self.model}")

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper

    async def _reap(self) -> None:
        """Ends idle sequences, so their slots go to the backlog without waiting for traffic."""
        interval = min(self.settings.max_sequence_idle_s / 4, 0.25)
        while True:
            await asyncio.sleep(interval)
            self.expire()

    def expire(self) -> None:
        """Ends the sequences idle past max_sequence_idle_s (none with a request in flight)."""
        now, idle = self._clock(), self.settings.max_sequence_idle_s
        for key, sequence in list(self._live.items()):
            if sequence.in_flight == 0 and now - sequence.last_used > idle:
                logger.info(
                    "model %r: sequence %s idle over %gs, ended", self.model, sequence.id, idle
                )
                del self._live[key]
                self._slots.release(sequence)

    def admit(self, flags: SequenceFlags | None) -> Turn:
        """Places a request in its sequence, synchronously (arrival order is run order);
        InvalidInput, with Triton's wording, for one that names no sequence, or one that
        continues a sequence never started (or ended, or idled out)."""
        if flags is None:
            raise InvalidInput(
                SEQUENCE_ID,
                f"inference request to model '{self.model}' must specify a non-zero or "
                "non-empty correlation ID",
            )
        self._check_id(flags.id)
        self.expire()
        sequence = self._live.get(flags.key)
        if sequence is None and not flags.start:
            raise InvalidInput(
                SEQUENCE_ID,
                f"inference request for sequence {flags.id} to model '{self.model}' must "
                "specify the START flag on the first request of the sequence",
            )
        now = self._clock()
        if sequence is None:
            sequence = _Sequence(flags.id, asyncio.get_running_loop().create_future(), now)
            self._live[flags.key] = sequence
            self._slots.reserve(sequence)
        elif flags.start:  # Triton's conflict rule: the new sequence follows on in its place
            logger.warning(
                "model %r: sequence %s started again before it ended; the previous one is "
                "ended early",
                self.model,
                flags.id,
            )
        turn = Turn(
            sequence,
            flags.start,
            flags.end,
            sequence.tail,
            asyncio.get_running_loop().create_future(),
        )
        sequence.tail = turn.done
        sequence.in_flight += 1
        sequence.last_used = now
        if flags.end:  # a later request with this id starts a new sequence
            del self._live[flags.key]
        return turn

    def _check_id(self, sequence_id: int | str) -> None:
        """The id fits the CORRID input's datatype (Triton's backend rule)."""
        if self._corrid is None:
            return
        if self._corrid.datatype == "BYTES":
            if not isinstance(sequence_id, str):
                raise InvalidInput(SEQUENCE_ID, "correlation ID in request is not a string")
            return
        if not isinstance(sequence_id, int):
            raise InvalidInput(SEQUENCE_ID, "correlation ID in request is not an unsigned int")
        limits = np.iinfo(self._corrid.dtype)
        if sequence_id > limits.max:
            raise InvalidInput(
                SEQUENCE_ID,
                f"correlation ID {sequence_id} is over the {self._corrid.datatype} "
                f"{self._corrid.name} input's {limits.max}",
            )

    async def run(
        self,
        turn: Turn,
        tensors: Mapping[str, np.ndarray],
        outputs: tuple[str, ...],
        timeout_s: float,
        infer: InferFn,
    ) -> dict[str, np.ndarray]:
        """The request's outputs, run once its sequence's previous request is done and the
        sequence holds a slot, with the controls and state filled in."""
        sequence = turn.sequence
        try:
            if turn.previous is not None:
                # Shielded: a cancelled request must not cancel the turn after it.
                await asyncio.shield(turn.previous)
            if sequence.failed is not None:
                raise sequence.failed
            await self._slot(sequence, timeout_s)
            filled = {**tensors, **self._control_values(turn), **self._state_values(turn)}
            wanted = tuple(dict.fromkeys((*outputs, *self.state_outputs)))
            result = await infer(filled, wanted)
            if self.state_outputs:
                sequence.state = {
                    s.input: np.array(result[s.output], copy=True) for s in self.settings.state
                }
            return {name: result[name] for name in outputs}
        finally:
            sequence.in_flight -= 1
            sequence.last_used = self._clock()
            turn.done.set_result(None)
            if turn.end and sequence.tail is turn.done:
                self._slots.release(sequence)
                sequence.state = {}

    async def _slot(self, sequence: _Sequence, timeout_s: float) -> None:
        if sequence.slot.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(sequence.slot), timeout_s)
        except TimeoutError:
            # Triton's backlog timeout: the sequence's waiting requests all fail.
            sequence.failed = DeadlineExceeded(
                f"sequence {sequence.id} waited {timeout_s:g}s for one of model "
                f"'{self.model}''s {self.slots} sequence slots"
            )
            if self._live.get((type(sequence.id), sequence.id)) is sequence:
                del self._live[(type(sequence.id), sequence.id)]
            self._slots.release(sequence)
            raise sequence.failed from None

    def _control_values(self, turn: Turn) -> dict[str, np.ndarray]:
        values = {"start": int(turn.start), "end": int(turn.end), "ready": 1}
        filled = {}
        for name, kind in self.settings.controls.items():
            spec = self._controls[name]
            if kind == "corrid":
                value: object = turn.sequence.id  # a string id as str: what ONNX Runtime reads
            else:
                value = values[kind]
            filled[name] = np.full(_one_row(spec), value, dtype=spec.dtype)
        return filled

    def _state_values(self, turn: Turn) -> dict[str, np.ndarray]:
        """The previous request's state outputs; zeros on a sequence's first request."""
        kept = turn.sequence.state
        return {
            name: kept[name]
            if name in kept and not turn.start
            else np.zeros(_one_row(spec), dtype=spec.dtype)
            for name, spec in self._state_inputs.items()
        }

    @property
    def in_progress(self) -> int:
        return len(self._live)


def _one_row(spec: TensorSpec) -> tuple[int, ...]:
    """A tensor's shape for one row: its dynamic axes 1 (Triton's rule for a state's
    variable dims on a sequence's first request)."""
    return tuple(d if isinstance(d, int) else 1 for d in spec.shape)
