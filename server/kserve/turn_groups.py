"""Plain KServe v2 requests to a light graph, queued a loop turn at a time: the direct lane's
requests read in one turn of the event loop join one group per model, checked and queued as one
request of all their rows, and each member's rows of the answer go back to it.

Why: under load a batch's answers go out together, so its clients' next requests arrive
together: 25-34 lane requests a loop turn on average at 64 clients (a tabular model, one
replica). Reading each the general way and checking and queueing it (the signature's checks, the
batcher's request, deadline, admission and future) was a third of a request's CPU; a group
pays the checks and the queueing once.

A request joins only where its answer cannot differ from the general path's (queued_infer.py):
- the model is a batched graph of this process whose rows stack (batch axis 0, no padded or
  other dynamic axis), and the priority policy leaves priority 0 as it is;
- the body is one JSON object of `inputs`, and optionally `outputs` and a string `id`, nothing
  else: every model input once, its datatype and row shape the signature's, all with the same
  rows, at most a batch of them; outputs as bare `{"name": ...}` specs of known names;
- its data reads by the general path's own function (tensor_inputs.typed_tensor).
Anything else goes the general way, which gives its own verdict. The group's rows are checked by
the signature again (GraphRuntime.validate) and queued at priority 0 with the default deadline,
as each member alone is; each member's answer is built by the general path's `response`.

Where a group fails as a whole in a way one member may have caused (refused by the queue, a
batch that failed), every member still waiting is queued again alone, the general way: each is
answered what it would have been answered alone. A deadline or a shutdown ends every member as
it ends each queued request.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from math import prod
from typing import Any, Protocol

import numpy as np
import orjson

from ferry.batcher.errors import InferenceFailed, QueueFull
from ferry.batcher.policy import most_at
from ferry.server.errors import InvalidInput, as_exception
from ferry.server.graph_runtime import GraphRuntime
from ferry.server.kserve.body_forms import BodyForm, body_form
from ferry.server.kserve.kserve_model import GraphView, KServeModel
from ferry.server.kserve.queued_infer import QueuedInfer, Results
from ferry.server.large_bodies import LARGE_BODY_BYTES
from ferry.server.replies import Reply
from ferry.server.response_size import answer_bytes
from ferry.server.routes.kserve_v2 import InferRequest, encode_response, response
from ferry.server.services import Services
from ferry.server.tensor_inputs import FLOATS, INTEGERS, joined_numbers, typed_tensor

REQUEST_KEYS = frozenset({"inputs", "outputs", "id"})
SPEC_KEYS = frozenset({"name", "shape", "datatype", "data"})
MAX_REMEMBERED_OUTPUTS = 256
MAX_FORMS = 8  # body forms remembered a model (body_forms.py), the latest first
UNPLANNED: Any = object()  # a graph whose plan is not decided yet


class Waiting(Protocol):
    """A member's request in the lane, waiting for its answer (direct_lane.py's); once it is
    answered, failed or left, it releases its member (Member.release)."""

    def answer(self, results: Results) -> None:
        """Answer from these results, through its QueuedInfer's `answer`."""
        ...

    def end(self, outcome: Reply | Exception) -> None:
        """Answer with this reply or error."""
        ...

    def requeue(self, queued: QueuedInfer) -> None:
        """Wait for this request queued the general way instead."""
        ...


@dataclass(frozen=True)
class InputRows:
    datatype: str
    dtype: np.dtype
    dims: tuple[int, ...]  # one row's shape


@dataclass(frozen=True)
class GroupPlan:
    """What a model's plain requests look like, and how many rows one group may hold."""

    # Its graph, weakly: TurnGroups keys its plans by graph weakly, and a plan that held its
    # graph would keep it (a model unloaded or replaced) alive for good.
    graph_ref: weakref.ReferenceType[GraphRuntime]
    inputs: dict[str, InputRows]
    max_rows: int
    priority: int  # 0 after the priority policy
    # The outputs each list of names asked for means (model.output_names), as first checked.
    outputs: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)
    # Bodies read whole lately, of a model of one input (body_forms.py).
    forms: deque[BodyForm] = field(default_factory=lambda: deque(maxlen=MAX_FORMS))

    @property
    def graph(self) -> GraphRuntime:
        graph = self.graph_ref()
        assert graph is not None, "a plan used without its graph"  # a member holds its model
        return graph


@dataclass(frozen=True)
class FormReading:
    """A plain body's reading but for its data: what a body of its form reads as."""

    header: dict[str, Any]  # without its data
    name: str
    rows: int
    wanted: tuple[str, ...]


@dataclass(eq=False)
class Member:
    """One request of a group: its checked tensors and wanted outputs, its body (read again
    should it be queued alone after all), and where its answer goes."""

    model: KServeModel
    plan: GroupPlan
    read: InferRequest
    rows: int
    body: bytes
    waiting: Waiting | None = None  # None before it joins and once released
    group: _Queued | None = None
    # A body of a known form: its data's items, read with its group's (TurnGroups._read_items).
    items: list[Any] | None = None

    def release(self) -> None:
        """Answered, failed or left: its links to its wait and its group go (refcounting then
        frees a request without the garbage collector), and once no member of its group waits
        (every client left), the group's rows are dropped."""
        group, self.group, self.waiting = self.group, None, None
        if group is not None:
            group.left()


def group_plan(services: Services, model: KServeModel) -> GroupPlan | None:
    """How `model`'s plain requests group; None where they may not."""
    graph = model.model if isinstance(model, GraphView) else None
    if not isinstance(graph, GraphRuntime) or graph.batcher is None:
        return None
    plan = graph.batch_plan
    if graph.images is not None or graph.sequences is not None or not graph.batchable:
        return None
    if not plan.batched or plan.padded or plan.rows_axes or plan.batch_axis != 0:
        return None
    inputs = {}
    for spec in graph.signature.inputs:
        dims = spec.shape[1:]
        if spec.datatype not in FLOATS | INTEGERS or not all(type(d) is int for d in dims):
            return None
        inputs[spec.name] = InputRows(spec.datatype, spec.dtype, tuple(int(d) for d in dims))
    decided = services.priority_policy.apply(0, None)
    if decided.clamped_from is not None:
        return None
    # A group is one chunk (tensor_chunks.chunk_rows), so the queue counts its requests once.
    per_row = sum(prod(rows.dims) for rows in inputs.values())
    limit = most_at(graph.batcher.limits, per_row)
    return GroupPlan(weakref.ref(graph), inputs, limit, decided.priority)


def read_plain(plan: GroupPlan, model: KServeModel, body: bytes) -> Member | None:
    """The request as a group member, or None where the general path must read it."""
    for form in plan.forms:
        items = form.items_of(body)
        if items is not None:
            return _read_form(plan, model, body, form.reading, items)
    member = _read_whole(plan, model, body)
    if member is not None and len(plan.inputs) == 1:
        ((name, _),) = member.read.tensors.items()
        reading = FormReading(member.read.header, name, member.rows, member.read.wanted)
        learnt = body_form(body, reading)
        if learnt is not None:
            plan.forms.appendleft(learnt)
    return member


def _read_form(
    plan: GroupPlan, model: KServeModel, body: bytes, reading: FormReading, items: list[Any]
) -> Member | None:
    """A body of a known form, with these data items: its items read with its group's, as
    _read_whole reads them (TurnGroups._read_items)."""
    if len(items) != reading.rows * prod(plan.inputs[reading.name].dims):
        return None  # as _read_whole: the general path names the count
    read = InferRequest(reading.header, {}, reading.wanted, set(), {}, 0, None)
    return Member(model, plan, read, reading.rows, body, items=items)


def _read_whole(plan: GroupPlan, model: KServeModel, body: bytes) -> Member | None:
    try:
        header = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(header) is not dict or not header.keys() <= REQUEST_KEYS:
        return None
    specs = header.get("inputs")
    if type(header.get("id", "")) is not str or type(specs) is not list:
        return None
    if len(specs) != len(plan.inputs):
        return None
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        array = _input_rows(plan, spec, arrays)
        if array is None:
            return None
        arrays[spec["name"]] = array
    rows = next(iter(arrays.values())).shape[0]
    wanted = _outputs(plan, model, header.get("outputs"))
    if rows > plan.max_rows or wanted is None:
        return None
    for spec in specs:
        del spec["data"]  # freed now, as read_request frees it
    read = InferRequest(header, arrays, wanted, set(), {}, 0, None)
    return Member(model, plan, read, rows, body)


def _input_rows(plan: GroupPlan, spec: Any, seen: dict[str, np.ndarray]) -> np.ndarray | None:
    """One input spec's rows, in the signature's shape; None where it is not plain."""
    if type(spec) is not dict or spec.keys() != SPEC_KEYS:
        return None
    name = spec["name"]
    expected = plan.inputs.get(name) if type(name) is str else None
    if expected is None or name in seen or spec["datatype"] != expected.datatype:
        return None
    shape = spec["shape"]
    if type(shape) is not list or not shape or shape[1:] != list(expected.dims):
        return None
    count = shape[0]
    if type(count) is not int or count < 1:
        return None
    if seen and count != next(iter(seen.values())).shape[0]:
        return None  # inputs of unequal rows: in a group one member's could hide another's
    try:
        array = typed_tensor(name, expected.datatype, expected.dtype, spec["data"])
    except InvalidInput:
        return None
    if array.size != count * prod(expected.dims):
        return None
    return array.reshape(count, *expected.dims)


def _outputs(plan: GroupPlan, model: KServeModel, specs: Any) -> tuple[str, ...] | None:
    """The outputs a plain request wants (by the model's own check), or None."""
    if specs is None:
        names: tuple[Any, ...] = ()
    elif type(specs) is list and all(type(s) is dict and s.keys() == {"name"} for s in specs):
        names = tuple(s["name"] for s in specs)
        if not all(type(name) is str for name in names):
            return None
    else:
        return None
    wanted = plan.outputs.get(names)
    if wanted is None:
        try:
            wanted = model.output_names(list(names))
        except InvalidInput:
            return None
        if len(plan.outputs) < MAX_REMEMBERED_OUTPUTS:  # bounded whatever clients ask for
            plan.outputs[names] = wanted
    return wanted


class TurnGroups:
    """The plain requests of this loop turn, by model, queued when the turn ends."""

    def __init__(self, services: Services, alone: Callable[[Member], QueuedInfer]) -> None:
        self._services = services
        # Queues a member the general way (raising what the general path raises).
        self._alone = alone
        self._plans: weakref.WeakKeyDictionary[GraphRuntime, GroupPlan | None] = (
            weakref.WeakKeyDictionary()
        )
        self._pending: dict[GraphRuntime, list[Member]] = {}
        # A group's answers of at most this many bytes in all are each within the bound and
        # written on the loop (response_size.py): each is written as response() writes it.
        self.plain_bytes = min(services.settings.max_response_bytes, LARGE_BODY_BYTES - 1)

    def read(self, model: KServeModel, body: bytes) -> Member | None:
        """`body` as a member of `model`'s group, or None (the general path's)."""
        graph = model.model if isinstance(model, GraphView) else None
        if not isinstance(graph, GraphRuntime):
            return None
        plan = self._plans.get(graph, UNPLANNED)  # one weak key made, not two
        if plan is UNPLANNED:
            if graph.batcher is None:  # not started: decided once it is
                return None
            plan = self._plans[graph] = group_plan(self._services, model)
        return None if plan is None else read_plain(plan, model, body)

    def answer_of(self, member: Member) -> Callable[[Results], tuple[int, Callable[[], Reply]]]:
        """The member's answer from its own rows of its outputs: the general path's (asked of
        a large group's members only: the rest are answered by _plain_answer)."""
        services = self._services

        def answer(results: Results) -> tuple[int, Callable[[], Reply]]:
            regions, limit = services.shared_memory.of(None), services.settings.max_response_bytes
            return response(member.model, member.read, regions, {}, 0, results[0], limit)

        return answer

    def join(self, member: Member, waiting: Waiting) -> None:
        member.waiting = waiting
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.setdefault(member.plan.graph, []).append(member)

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        for members in pending.values():
            group: list[Member] = []
            rows = 0
            for member in members:
                if member.waiting is None:
                    continue
                if group and rows + member.rows > member.plan.max_rows:
                    self._queue(group)
                    group, rows = [], 0
                group.append(member)
                rows += member.rows
            if group:
                self._queue(group)

    def _queue(self, members: list[Member]) -> None:
        plan = members[0].plan
        members = self._read_items(plan, members)
        if not members:
            return
        tensors = {
            name: np.concatenate([m.read.tensors[name] for m in members]) for name in plan.inputs
        }
        wanted = tuple(dict.fromkeys(name for m in members for name in m.read.wanted))
        try:
            rows = replace(plan.graph.validate(tensors), requests=len(members))
            (future,) = plan.graph.submit_rows(rows, wanted, None, plan.priority)  # one chunk
        except (InvalidInput, QueueFull):  # perhaps one member's doing: each on its own
            for member in members:
                self.queue_alone(member)
            return
        # Broad on purpose: whatever keeps the group from its queue, every member is answered
        # (a closed batcher's refusal, as the general path answers it).
        except Exception as exc:
            for member in members:
                self.end(member, exc)
            return
        group = _Queued(self, members, future, len(members))
        for member in members:
            member.group = group
        future.add_done_callback(group.done)

    def _read_items(self, plan: GroupPlan, members: list[Member]) -> list[Member]:
        """The members with their data read: a known form's items all in one pass where
        tensor_inputs.joined_numbers can, else each as _read_whole reads it. One whose items
        do not read as numbers is queued alone, for the general path's verdict."""
        lists = [m.items for m in members if m.items is not None]
        if not lists:
            return members
        ((name, expected),) = plan.inputs.items()  # forms are kept for one input only
        datatype, dtype = expected.datatype, expected.dtype
        joined = joined_numbers(datatype, dtype, lists)
        start = 0
        kept = []
        for member in members:
            items, member.items = member.items, None
            if items is None:
                kept.append(member)
                continue
            if joined is not None:
                array, start = joined[start : start + len(items)], start + len(items)
            else:
                try:
                    array = typed_tensor(name, datatype, dtype, items)
                except InvalidInput:
                    self.queue_alone(member)
                    continue
            member.read.tensors[name] = array.reshape(member.rows, *expected.dims)
            kept.append(member)
        return kept

    def queue_alone(self, member: Member) -> None:
        """The member queued the general way, for the verdict it gets alone."""
        waiting = member.waiting
        if waiting is None:
            return
        member.group = None
        try:
            queued = self._alone(member)
        except Exception as exc:  # refused before queueing: answered as the general path's
            waiting.end(exc)
            return
        waiting.requeue(queued)

    def end(self, member: Member, outcome: Reply | Exception) -> None:
        if member.waiting is not None:
            member.waiting.end(outcome)


@dataclass(eq=False)
class _Queued:
    """A group queued (one chunk: one future), until it is done or every member has left."""

    groups: TurnGroups
    members: list[Member]
    future: asyncio.Future[dict[str, np.ndarray]]
    waiting: int  # members not yet released

    def done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return  # every member left
        error = future.exception()
        if isinstance(error, InferenceFailed):  # maybe one member's rows
            for member in self.members:
                self.groups.queue_alone(member)
            return
        if error is not None:
            for member in self.members:
                self.groups.end(member, as_exception(error))
            return
        graph = self.members[0].plan.graph
        values = graph.rows_answer([future.result()])
        # A member's answer is at most the group's: where that is small, none is refused or
        # written off the loop, and each is written here as response() would write it.
        small = sum(map(answer_bytes, values.values())) <= self.groups.plain_bytes
        # Every member's model is a view of this graph, with its signature (GraphView).
        datatypes = {n: graph.signature.output(n).datatype for n in values} if small else {}
        start = 0
        for member in self.members:
            rows = slice(start, start + member.rows)
            start += member.rows
            waiting = member.waiting
            if waiting is None:
                continue
            outputs = {name: values[name][rows] for name in member.read.wanted}
            if small:
                waiting.end(_plain_answer(member, outputs, datatypes))
            else:
                waiting.answer([outputs])

    def left(self) -> None:
        """A member released: with none left waiting, the rows are dropped (done: a no-op)."""
        self.waiting -= 1
        if not self.waiting:
            self.future.cancel()


def _plain_answer(
    member: Member, outputs: dict[str, np.ndarray], datatypes: dict[str, str]
) -> Reply | Exception:
    """A member's answer of a size already checked: what response() writes for a plain request
    (no binary outputs, top-k or shared memory), or what it would raise. `datatypes`: by
    output, its group's graph's."""
    header = member.read.header
    try:
        return encode_response(member.model.name, header.get("id"), outputs, set(), datatypes)
    except Exception as exc:  # answered as the general path answers what its writing raises
        return exc
