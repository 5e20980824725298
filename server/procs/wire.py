"""What crosses the API/engine process boundary: msgspec structs, tensors as raw frames.

Every message is one msgpack-encoded tagged struct (frame 0), followed by the raw bytes of the
arrays it describes: token ids or a plain graph's input tensors on the way in, result tensors on
the way out (string tensors as a msgpack list). Nothing is pickled.
Errors cross as their class name, message and plain attributes, and are rebuilt as the same
class, so the API process maps them to statuses exactly as an in-process server does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

from ferry.backends.batch_plan import BatchPlan
from ferry.backends.tensor_signature import Signature
from ferry.batcher import TensorRows, TokenSequence
from ferry.batcher import errors as batcher_errors
from ferry.batcher.cost_model import RowTime
from ferry.llm import errors as llm_errors
from ferry.llm.base import EngineStats, GenerationDelta, SamplingSettings
from ferry.server import errors as server_errors

# A received array's bytes: a view into its message's buffer (loop_socket.py), or bytes.
Buffer = bytes | memoryview


class Hello(msgspec.Struct, tag=True):
    """An API process asks who serves (sent at start and after an engine restart); the engine
    watches `pid` and aborts the process's work when it exits. `arena`: the path of its shared
    memory arena (arena.py), which the engine maps; empty when it has none."""

    pid: int
    arena: str = ""


class ModelInfo(msgspec.Struct):
    name: str
    backend: str
    output_names: tuple[str, ...]
    sequence_outputs: tuple[str, ...]
    max_concurrency: int
    widths: dict[str, int]
    takes_token_types: bool = False


class GraphInfo(msgspec.Struct):
    """A plain graph as the engine process serves it: what an API process validates a request
    by and renders its answer with, so it needs neither the graph nor a session of its own."""

    name: str
    backend: str
    max_concurrency: int
    signature: Signature
    batch_plan: BatchPlan  # how its requests share batches (rows, padded axes)
    default_outputs: tuple[str, ...]
    class_keys: dict[str, list[str | int]]  # a ZipMap output's classes
    # The graph's metadata_props: an image model's preprocessing (`ferry.preprocess`), which
    # the API process decodes images by.
    metadata: dict[str, str] = {}


class LLMInfo(msgspec.Struct):
    name: str
    max_context_tokens: int
    sampling_options: tuple[str, ...]
    max_concurrent_generations: int
    adapters: tuple[str, ...]


class Info(msgspec.Struct, tag=True):
    pid: int
    models: tuple[ModelInfo, ...]
    llms: tuple[LLMInfo, ...]
    graphs: tuple[GraphInfo, ...] = ()
    # Each served model's settings as the engine runs it (a load's config override applied),
    # as JSON: the API processes check and render its requests by them.
    settings: dict[str, str] = {}
    # In the answer to a Hello: the engine mapped that API process's arena (it may use it).
    arena: bool = False


class Models(msgspec.Struct, tag=True):
    """The engine serves other models (a load or unload, model_repository.py): every API
    process applies it, and acks, before the load or unload is answered."""

    seq: int
    info: Info


class Submit(msgspec.Struct, tag=True):
    """A validated request for one model, as tensors (its TensorRows); frames: one per tensor,
    in order. A plain graph's are its inputs, answered as one Row (index 0); a token model's
    are its rows end to end, ragged as Triton batches them (`sequence_rows`), one Row each."""

    rid: int
    model: str
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    rows: int
    axis_sizes: dict[str, int]
    shape_key: tuple[tuple[str, int], ...]
    timeout_s: float | None
    outputs: tuple[str, ...] | None  # None: the model's configured ones
    priority: int
    # The request's W3C trace context (traceparent, tracestate) when it is traced, so that the
    # engine's spans join its trace; empty when untraced.
    trace: dict[str, str] = {}
    # Its tensors written into the API process's arena instead of a frame (arena.py):
    # {index: (offset, bytes)}; the frames are the other tensors', in order.
    arena: dict[int, tuple[int, int]] = {}


class Cancel(msgspec.Struct, tag=True):
    """Drop request `rid` (or stop generation `rid`); answered by a Reply, which tells the API
    process the request's bytes were read (rows made before it may still come)."""

    rid: int


class Admit(msgspec.Struct, tag=True):
    """A request's `count` generations, admitted together or refused together by the engine
    process, which alone sees every API process's: a Reply (True, or EngineOverloaded)."""

    rid: int  # the ticket its generations start under
    model: str
    count: int


class Release(msgspec.Struct, tag=True):
    """No more generations start under this ticket (the request ended)."""

    ticket: int


class Generate(msgspec.Struct, tag=True):
    rid: int
    ticket: int  # an admitted Admit's rid
    model: str
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingSettings
    adapter: str | None
    priority: int
    cache_salt: str | None = None
    trace: dict[str, str] = {}  # as Submit's


class Call(msgspec.Struct, tag=True):
    """A rare control call (adapters, readiness): answered by one Reply."""

    rid: int
    model: str
    method: str
    args: tuple[str, ...] = ()


# A Call's method the engine answers at once: its Reply comes after every message the engine
# sent that API process before (one socket keeps their order).
SYNC = "sync"


class Ack(msgspec.Struct, tag=True):
    """An API process has applied an Adapters or Models update."""

    seq: int


class WireError(msgspec.Struct):
    kind: str
    args: tuple[str, ...]
    attrs: dict[str, str | int | float | bool | None]


class Row(msgspec.Struct, tag=True):
    """One sequence's outputs; one frame per name, in order."""

    rid: int
    index: int
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]


class Failed(msgspec.Struct, tag=True):
    """A sequence (index >= 0), a whole request (index -1) or a stream failed."""

    rid: int
    index: int
    error: WireError


class Delta(msgspec.Struct, tag=True):
    rid: int
    delta: GenerationDelta


class Reply(msgspec.Struct, tag=True):
    rid: int
    value: bool | tuple[str, ...] | None = None
    error: WireError | None = None


class Adapters(msgspec.Struct, tag=True):
    """An LLM's adapters changed: every API process applies it before the load is answered."""

    seq: int
    model: str
    names: tuple[str, ...]


class Classes(msgspec.Struct, tag=True):
    """A plain graph's ZipMap classes, learned from an answer (a graph with a string input has
    no warm-up to learn them at start): sent to every API process before that answer."""

    model: str
    keys: dict[str, list[str | int]]


class Stats(msgspec.Struct, tag=True):
    """The engine's LLM counters and model health, pushed periodically."""

    llms: dict[str, EngineStats]
    models_ready: dict[str, bool]
    llms_ready: dict[str, bool]
    # Each encoder's row time once its cost model is fitted: the API processes refuse a
    # deadline it can never meet themselves (deadline_floor.py).
    fastest_rows: dict[str, RowTime]


ToEngine = Hello | Submit | Cancel | Admit | Release | Generate | Call | Ack
ToApi = Info | Row | Failed | Delta | Reply | Stats | Adapters | Classes | Models

encoder = msgspec.msgpack.Encoder()
# One ZMQ message carries a list of headers (what one loop turn sent), then their frames.
to_engine = msgspec.msgpack.Decoder(list[ToEngine])
to_api = msgspec.msgpack.Decoder(list[ToApi])


def frame_count(header: object) -> int:
    """How many of the frames after the headers belong to this header."""
    if isinstance(header, Submit):
        return len(header.names) - len(header.arena)
    if isinstance(header, Row):
        return len(header.names)
    return 0


# A token request's tensors: each row's length (Triton's ragged batch input, its element
# counts), then every row's ids, mask and, where any row has them, segment ids, end to end.
LENGTHS, IDS, MASK, TYPES = "lengths", "input_ids", "attention_mask", "token_type_ids"


def sequence_rows(sequences: Sequence[TokenSequence]) -> TensorRows:
    tensors = {
        LENGTHS: np.array([seq.length for seq in sequences], np.int64),
        IDS: np.concatenate([seq.input_ids for seq in sequences]).astype(np.int64, copy=False),
        MASK: np.concatenate([seq.attention_mask for seq in sequences]).astype(
            np.int64, copy=False
        ),
    }
    if any(seq.token_type_ids is not None for seq in sequences):
        tensors[TYPES] = np.concatenate(
            [
                np.zeros(seq.length, np.int64) if seq.token_type_ids is None else seq.token_type_ids
                for seq in sequences
            ]
        ).astype(np.int64, copy=False)
    return TensorRows(tensors, len(sequences), {})


def row_sequences(rows: TensorRows) -> list[TokenSequence]:
    """`sequence_rows` undone: the request's token sequences (views of the frames)."""
    tensors = rows.tensors
    ids, masks, types = tensors[IDS], tensors[MASK], tensors.get(TYPES)
    sequences, start = [], 0
    for length in tensors[LENGTHS].tolist():
        end = start + length
        row_types = None if types is None else types[start:end]
        sequences.append(TokenSequence(ids[start:end], masks[start:end], row_types))
        start = end
    return sequences


# A string tensor's dtype: its values cross as a msgpack list (bytes and str kept apart).
OBJECT = np.dtype(object).str


def pack_arrays(
    arrays: Mapping[str, np.ndarray],
) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...], list[memoryview | bytes]]:
    """Each array's dtype, shape and bytes (no copy of a C-ordered numeric array)."""
    dtypes, shapes = [], []
    frames: list[memoryview | bytes] = []
    for value in arrays.values():
        # A backend's row is nearly always a C-ordered ndarray already: np.require costs ~0.6 us
        # a call. (np.ascontiguousarray would turn a 0-d array, a label, into 1-d.)
        c_ordered = type(value) is np.ndarray and value.flags.c_contiguous
        array = value if c_ordered else np.require(value, requirements="C")
        dtypes.append(array.dtype.str)
        shapes.append(array.shape)
        if array.dtype == object:
            frames.append(msgspec.msgpack.encode(array.ravel().tolist()))
        elif array.size == 0:  # memoryview cannot cast a view with a zero in its shape
            frames.append(b"")
        else:
            frames.append(memoryview(array).cast("B"))  # type: ignore[arg-type]  # ndarray has the buffer protocol; numpy declares it for 3.12+ only
    return tuple(dtypes), tuple(shapes), frames


def unpack_arrays(
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    frames: Sequence[Buffer],
) -> dict[str, np.ndarray]:
    arrays = {}
    for name, dtype, shape, frame in zip(names, dtypes, shapes, frames, strict=True):
        if dtype == OBJECT:
            values = msgspec.msgpack.decode(frame)
            arrays[name] = np.array(values, dtype=object).reshape(shape)
        else:
            arrays[name] = np.frombuffer(frame, dtype=dtype).reshape(shape)
    return arrays


def pack_row(
    rid: int, index: int, row: dict[str, np.ndarray]
) -> tuple[Row, list[memoryview | bytes]]:
    dtypes, shapes, frames = pack_arrays(row)
    return Row(rid, index, tuple(row), dtypes, shapes), frames


def unpack_row(header: Row, frames: Sequence[Buffer]) -> dict[str, np.ndarray]:
    return unpack_arrays(header.names, header.dtypes, header.shapes, frames)


def pack_request(
    rid: int,
    model: str,
    rows: TensorRows,
    timeout_s: float | None,
    outputs: tuple[str, ...] | None,
    priority: int,
    trace: dict[str, str],
) -> tuple[Submit, list[memoryview | bytes]]:
    dtypes, shapes, frames = pack_arrays(rows.tensors)
    header = Submit(
        rid,
        model,
        tuple(rows.tensors),
        dtypes,
        shapes,
        rows.rows,
        dict(rows.axis_sizes),
        rows.shape_key,
        timeout_s,
        outputs,
        priority,
        trace,
    )
    return header, frames


def unpack_request(header: Submit, frames: Sequence[Buffer]) -> TensorRows:
    tensors = unpack_arrays(header.names, header.dtypes, header.shapes, frames)
    return TensorRows(tensors, header.rows, header.axis_sizes, header.shape_key)


# The exceptions that cross: the batcher's, the LLM engines' and the server's own (a refusal
# the engine decides, such as the deadline floor), rebuilt by class name.
_ERRORS: dict[str, type[Exception]] = {
    name: value
    for module in (batcher_errors, llm_errors, server_errors)
    for name, value in vars(module).items()
    if isinstance(value, type) and issubclass(value, Exception)
}
_PLAIN = (str, int, float, bool, type(None))


def error_to_wire(exc: BaseException) -> WireError:
    kind = type(exc).__name__
    attrs = {k: v for k, v in vars(exc).items() if isinstance(v, _PLAIN)}
    return WireError(kind, tuple(str(a) for a in exc.args), attrs)


def error_from_wire(error: WireError, fallback: type[Exception]) -> Exception:
    """The same exception class (another class crosses as `fallback` with its message)."""
    cls = _ERRORS.get(error.kind)
    if cls is None:
        return fallback(f"{error.kind}: {' '.join(error.args)}")
    exc = cls.__new__(cls)
    Exception.__init__(exc, *error.args)
    exc.__dict__.update(error.attrs)
    return exc
