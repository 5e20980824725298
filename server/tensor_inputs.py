"""A request's tensors checked against a graph's signature, once, before any work.

JSON values become arrays of the graph's own datatype only when every item is of that kind: an
integer input takes integers in its range, a boolean one booleans, a float one numbers (FP16
too, which Triton refuses as JSON), a BYTES one strings; BF16 only as binary. Nothing is cast
silently. Shapes must
match the graph's fixed axes, and axes of one name must agree across inputs. The result is a
`TensorRows`, which the batcher takes without checking again.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Mapping
from functools import cache
from itertools import chain
from typing import Any

import numpy as np

from ferry.backends.tensor_signature import Signature, TensorSpec
from ferry.batcher.tensor_padding import TensorRows
from ferry.server.errors import InvalidInput

FLOATS = {"FP16", "FP32", "FP64"}
INTEGERS = {"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"}
BF16_BINARY = "BF16 data goes as raw contents (gRPC) or binary tensor data (HTTP), not JSON"
# Lists nested deeper are refused (numpy's own limit is 64 axes, past which it raises).
MAX_DIMS = 32


def typed_tensor(name: str, datatype: str, dtype: np.dtype, data: Any) -> np.ndarray:
    """JSON `data` (a value, or lists nested to any depth) -> an array of `dtype` in the
    nesting's shape, every item of the datatype's kind."""
    if isinstance(data, np.ndarray):  # converted by the same rules in a worker (json_bodies.py)
        return data.astype(dtype, copy=False)
    fast = plain_numbers(datatype, dtype, data)
    if fast is not None:
        return fast
    shape, flat = nested(name, data)
    return _typed_items(name, datatype, dtype, flat).reshape(shape)


def typed_array(name: str, datatype: str, dtype: np.dtype, flat: list[Any]) -> np.ndarray:
    """Flat JSON items -> a 1-D array of `dtype`, every item of the datatype's kind."""
    fast = plain_numbers(datatype, dtype, flat)
    return fast if fast is not None else _typed_items(name, datatype, dtype, flat)


def plain_numbers(datatype: str, dtype: np.dtype, data: Any) -> np.ndarray | None:
    """`data`, numbers (or booleans, for BOOL) nested in lists, as an array of `dtype` in one
    pass at C speed; None wherever the item-by-item check must decide (it names the culprit).

    Checking each item's type first cost as much as the conversion (~1.7 ms of an image's
    150,528 numbers, with the event loop or a worker holding the GIL). numpy's own inference
    tells every other kind apart (strings and null give a dtype that is not a number, ragged
    lists an error), except a boolean among numbers, which it reads as 0 or 1: only the items
    equal to 0 or 1 have their type looked at. Short lists are the exception (`_small_flat`):
    there one Python pass over the items' types costs less than numpy's calls."""
    if datatype == "BOOL":
        if not _numbers_only(data):
            return None
        try:
            array = np.array(data)
        except (ValueError, OverflowError):
            return None
        return array if array.dtype.kind == "b" else None
    if datatype not in FLOATS and datatype not in INTEGERS:
        return None
    flat = _small_flat(data)
    if flat is not None:
        return _small_numbers(datatype, dtype, data, flat)
    if not _numbers_only(data):
        return None
    try:
        array = np.array(data)
    except (ValueError, OverflowError):  # ragged nesting
        return None
    kind = array.dtype.kind  # "u": an integer past int64's range; "b": only booleans
    if not (kind == "i" or (kind == "f" and datatype in FLOATS)) or _has_booleans(data, array):
        return None
    if datatype in FLOATS:
        if dtype != array.dtype and array.size:
            top = np.finfo(dtype).max
            if array.max() > top or array.min() < -top:
                return None  # past the datatype's range (or infinite): the exact check decides
        return array.astype(dtype, copy=False)
    if dtype != array.dtype and array.size:
        limits = np.iinfo(dtype)
        if not (limits.min <= int(array.min()) and int(array.max()) <= limits.max):
            return None
    return array.astype(dtype, copy=False)


def joined_numbers(datatype: str, dtype: np.dtype, lists: Iterable[list[Any]]) -> np.ndarray | None:
    """Flat lists of numbers, each as plain_numbers reads it, as one 1-D array in one pass
    (server/kserve/turn_groups.py: a group's requests); None where any one must be read alone.

    Only short lists: for one of them plain_numbers' verdict is `_small_numbers`', whose checks
    (the items' types, the datatype's range) pass for all the items together exactly when they
    pass for each list's, and whose conversion is item by item."""
    if datatype not in FLOATS and datatype not in INTEGERS:
        return None
    lists = list(lists)
    if not all(0 < len(items) <= SHORT_LIST and type(items[0]) is not list for items in lists):
        return None
    flat = list(chain.from_iterable(lists))
    return _small_numbers(datatype, dtype, flat, flat)


def _small_flat(data: Any) -> list[Any] | None:
    """The items of lists nested at most two deep holding at most SHORT_LIST of them (a tabular
    row, a short sequence), else None.

    For these, a numpy call costs more than a Python pass over the items (~1 us each against
    ~0.7 us for 30 items): one pass reads every item's type, which replaces the three passes
    (numbers only, booleans, range) of the general path."""
    if type(data) is not list or not data or len(data) > SHORT_LIST:
        return None
    first = data[0]
    if type(first) is not list:
        return data
    if not first or type(first[0]) is list or len(first) * len(data) > SHORT_LIST:
        return None  # empty rows, deeper nesting or many items: the general path
    if not all(type(row) is list for row in data):
        return None
    flat = list(chain.from_iterable(data))
    return flat if len(flat) <= SHORT_LIST else None


@cache
def _range(dtype: np.dtype) -> tuple[float, float]:
    """The values a short list's items must lie within to be read as `dtype`. An item past
    float64's range cannot be a JSON float; an integer past 64 bits numpy refuses."""
    if dtype.kind == "f":
        top = float(np.finfo(dtype).max)
        return -top, top
    limits = np.iinfo(dtype)
    return limits.min, limits.max


def _small_numbers(datatype: str, dtype: np.dtype, data: Any, flat: list[Any]) -> np.ndarray | None:
    """plain_numbers for a short list: the same verdicts, from each item's type."""
    kinds = set(map(type, flat))
    if not kinds <= ({int, float} if datatype in FLOATS else {int}):
        return None  # booleans, strings, null or deeper lists: the exact check names the item
    low, high = _range(dtype)
    if min(flat) < low or max(flat) > high:
        return None  # past the datatype's range: the exact check decides
    try:
        return np.array(data, dtype=dtype)
    except (ValueError, OverflowError):  # ragged rows
        return None


def _numbers_only(data: Any) -> bool:
    """Whether every item as deep as the first one is a number (or a boolean), and the nesting
    at most MAX_DIMS deep: numpy's inference would first make strings of unequal lengths an
    items x longest-string array (an 82 KB body, ~950 MB), and only then be looked at.

    `sum` adds at C speed (~1/5 of the conversion) and raises on anything not a number; a
    string or an object a level up is iterated into its characters or keys, and raises too."""
    depth, first = 0, data
    while isinstance(first, list) and depth <= MAX_DIMS:
        depth, first = depth + 1, first[0] if first else None
    if depth > MAX_DIMS:
        return False
    items: Iterable[Any] = data if depth else (data,)
    for _ in range(depth - 1):
        items = chain.from_iterable(items)
    try:
        sum(items)
    except (TypeError, OverflowError):  # OverflowError: an integer past a float's range
        return False
    return True


# Items equal to 0 or 1 in nested lists looked at one by one, at most (flat lists: all of them,
# at C speed); a short flat list has every item's type read (cheaper than finding them).
NESTED_SUSPECTS = 256
SHORT_LIST = 512


def _has_booleans(data: Any, array: np.ndarray) -> bool:
    """Whether an item that `array` holds as 0 or 1 was a JSON boolean (also True when nested
    lists hold too many such items to look at)."""
    if array.ndim == 0:
        return type(data) is bool
    if array.ndim == 1 and len(data) <= SHORT_LIST:
        return bool in set(map(type, data))
    values = array.reshape(-1)
    suspects = np.flatnonzero((values == 0) | (values == 1))
    if not len(suspects):
        return False
    if array.ndim == 1 and len(suspects) > len(data) // 8:  # a mask of ones: read them all
        return bool in set(map(type, data))
    if array.ndim == 1:
        items = operator.itemgetter(*suspects.tolist())(data)
        return bool in set(map(type, items if len(suspects) > 1 else (items,)))
    if len(suspects) > NESTED_SUSPECTS:
        return True
    for index in zip(*np.unravel_index(suspects, array.shape), strict=True):
        item = data
        for position in index:
            item = item[position]
        if type(item) is bool:
            return True
    return False


def _typed_items(name: str, datatype: str, dtype: np.dtype, flat: list[Any]) -> np.ndarray:
    """typed_array item by item: slower, and says which item is of the wrong kind."""
    if datatype == "BF16":  # its bits travel as they are; numbers would need a cast
        raise InvalidInput(name, BF16_BINARY)
    kinds = set(map(type, flat))  # checked at C speed: the common case needs no loop
    if datatype == "BOOL":
        allowed: set[type] = {bool}
    elif datatype in FLOATS:
        allowed = {int, float}
    elif datatype == "BYTES":
        allowed = {str}
    else:
        allowed = {int}
    if not kinds <= allowed:
        wrong = (
            (i, x)
            for i, x in enumerate(flat)
            if type(x) not in allowed and not (datatype in INTEGERS and _huge(x))
        )
        index, item = next(wrong, (None, None))
        if index is not None:
            raise InvalidInput(
                f"{name}[{index}]",
                f"{datatype} data must be {_kind(datatype)}, got {_shown(item)}",
            )
    if datatype == "BYTES":
        return np.array(flat, dtype=object)
    if datatype in FLOATS:
        wide = np.array(flat, dtype=np.float64)
        with np.errstate(over="ignore"):  # found just below, and refused naming the item
            array = wide.astype(dtype)
        lost = np.isfinite(wide) & ~np.isfinite(array)
        if lost.any():
            index = int(np.argmax(lost))
            raise InvalidInput(f"{name}[{index}]", f"{flat[index]!r} is outside {datatype}'s range")
        return array
    if datatype == "BOOL":
        return np.array(flat, dtype=np.bool_)
    return _integers(name, datatype, dtype, flat)


def _huge(item: Any) -> bool:
    """orjson reads an integer past 64 bits as a float: such a float is an integer out of
    range, not a float."""
    return isinstance(item, float) and item.is_integer() and abs(item) >= 2**63


def _integers(name: str, datatype: str, dtype: np.dtype, flat: list[Any]) -> np.ndarray:
    limits = np.iinfo(dtype)
    try:  # at C speed: numpy raises for an item outside 64 bits, the bounds check the rest
        huge = float in set(map(type, flat))  # numpy would cast it, not raise
        wide = None if huge else np.array(flat, dtype=np.uint64 if limits.min == 0 else np.int64)
    except OverflowError:
        wide = None
    if wide is not None and (
        not wide.size or (limits.min <= wide.min() and wide.max() <= limits.max)
    ):
        return wide.astype(dtype, copy=False)
    for index, item in enumerate(flat):  # name the first item out of range
        if not limits.min <= item <= limits.max:
            raise InvalidInput(
                f"{name}[{index}]",
                f"{repr(int(item))[:40]} is outside {datatype}'s range "
                f"({limits.min}..{limits.max})",
            )
    raise AssertionError("an item is out of range")  # pragma: no cover


def _kind(datatype: str) -> str:
    if datatype == "BOOL":
        return "booleans"
    if datatype in FLOATS:
        return "numbers"
    return "strings" if datatype == "BYTES" else "integers"


def _shown(item: Any) -> str:
    kind = {bool: "a boolean", float: "a float", int: "an integer", str: "a string"}
    shown = kind.get(type(item), "an object")
    return f"{shown} ({json.dumps(item)[:40]})" if item is not None else "null"


def nested(name: str, data: Any, depth: int = 0) -> tuple[list[int], list[Any]]:
    """A nested JSON list's shape and its items in order; ragged nesting is refused, and so is
    nesting past MAX_DIMS (`depth`: the lists around `data`)."""
    if not isinstance(data, list):
        return [], [data]
    if depth == MAX_DIMS:
        raise InvalidInput(
            name, f"lists nested more than {MAX_DIMS} deep (a tensor has at most {MAX_DIMS} axes)"
        )
    if not data:
        return [0], []
    kinds = set(map(type, data))  # at C speed: an image's 150,528 numbers cost ~1 ms, not ~6
    if list not in kinds:  # the innermost level (a row of numbers): no call per item
        return [len(data)], data
    if len(kinds) != 1:
        raise InvalidInput(name, "lists mixed with single values (a tensor is rectangular)")
    parts = [nested(name, item, depth + 1) for item in data]
    shape = parts[0][0]
    if any(part[0] != shape for part in parts):
        raise InvalidInput(name, "nested lists of different lengths (a tensor is rectangular)")
    return [len(data), *shape], [item for part in parts for item in part[1]]


def json_tensor(spec: TensorSpec, data: Any) -> np.ndarray:
    """/predict's nested list for `spec` as an array of the graph's datatype."""
    return typed_tensor(spec.name, spec.datatype, spec.dtype, data)


def records_tensors(signature: Signature, records: list[Any]) -> dict[str, np.ndarray]:
    """Tabular records (objects keyed by input name, one a row) -> a tensor per input."""
    columns: dict[str, list[Any]] = {name: [] for name in signature.input_names}
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise InvalidInput(f"inputs[{index}]", "a record must be an object of input: value")
        unknown = set(record) - set(columns)
        if unknown:
            raise InvalidInput(
                f"inputs[{index}].{sorted(unknown)[0]}",
                f"not an input of this model; inputs are {list(columns)}",
            )
        for name, column in columns.items():
            if name not in record:
                raise InvalidInput(f"inputs[{index}].{name}", "required input is missing")
            column.append(record[name])
    tensors = {}
    for name, column in columns.items():
        spec = signature.input(name)
        if name in signature.images and all(isinstance(v, str) for v in column):
            tensors[name] = np.array(column, dtype=object)  # base64 images, decoded later
            continue
        array = json_tensor(spec, column)
        if array.ndim == len(spec.shape) - 1 and spec.shape[-1] == 1:
            array = array[..., None]  # one input per column: a scalar is that column's [1]
        tensors[name] = array
    return tensors


def valid_rows(
    signature: Signature, tensors: Mapping[str, np.ndarray], batchable: bool
) -> TensorRows:
    """The request's tensors, checked against the graph: every input present and no other,
    fixed axes matched, rows and named axes agreeing between inputs."""
    unknown = set(tensors) - set(signature.input_names)
    if unknown:
        raise InvalidInput(
            sorted(unknown)[0],
            f"not an input of this model; inputs are {list(signature.input_names)}",
        )
    sizes: dict[str, tuple[int, str]] = {}  # axis name -> its size and the input that set it
    rows: int | None = None
    for spec in signature.inputs:
        if spec.name not in tensors:
            raise InvalidInput(spec.name, "required input is missing")
        array = tensors[spec.name]
        if array.ndim != len(spec.shape):
            raise InvalidInput(
                spec.name,
                f"shape {list(array.shape)} does not match the model's {spec.metadata_shape()}",
            )
        for axis, (have, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
            if isinstance(want, int):
                if have != want:
                    raise InvalidInput(
                        spec.name,
                        f"axis {axis} must be {want}, got {have} (shape {list(array.shape)}; "
                        f"the model's is {spec.metadata_shape()})",
                    )
                continue
            if have < 1:
                raise InvalidInput(spec.name, f"axis {axis} ({want}) must be at least 1, got 0")
            if axis == 0 and batchable:
                if rows is not None and have != rows:
                    raise InvalidInput(
                        spec.name, f"has {have} rows where the other inputs have {rows}"
                    )
                rows = have
                continue
            if want in sizes and sizes[want][0] != have:
                size, other = sizes[want]
                raise InvalidInput(
                    spec.name,
                    f"axis {axis} ({want}) is {have}, but input {other!r} has it {size}",
                )
            sizes[want] = (have, spec.name)
    axis_sizes = {axis: size for axis, (size, _) in sizes.items()}
    return TensorRows(dict(tensors), rows or 1, axis_sizes)
