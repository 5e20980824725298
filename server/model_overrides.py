"""A load request's `parameters.config` (Triton's model repository extension) applied to a model's
repository entry: the settings the model is loaded with.

The config is a JSON object of Ferry's own per-model fields (`batching`, `timeout_s`, ...,
`max_running` for an LLM) or Triton's model configuration fields that map onto them
(`max_batch_size`, `dynamic_batching`, `instance_group`). Given fields replace the entry's
(tables are merged one level down); fields it does not give keep the entry's values, where
Triton would fill them in from the model file: Ferry's entry is that file's reading. Every load
starts again from the repository's entry, so overrides never pile up. Anything Ferry cannot honour
(a model's name or files, its inputs and outputs, a Triton field with no Ferry meaning) is refused
with a 400 naming it, before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
from pydantic import ValidationError

from ferry.llm.options import foreign_option, option_names
from ferry.server.errors import LoadRefused
from ferry.server.settings import LLMSettings, ModelSettings, setting_location

Entry = ModelSettings | LLMSettings
CONFIG = "parameters.config"
FIXED = ("name", "path")  # the repository's: a config cannot move a model or rename it
# The entry's alone: a load cannot make a model stateful, or not (its sequences live in it).
ENTRY_ONLY = ("sequence_batching",)
US_PER_S = 1_000_000
# The batcher's limits its backend decides at start, which the settings refuse to be given.
BACKEND_DECIDED = ("max_concurrent_batches", "prepared_batches")
DEVICES = {"KIND_CPU": "cpu", "KIND_GPU": "cuda"}  # Triton's instance kinds as backend.device


def with_config(entry: Entry, config: str | None) -> Entry:
    """The entry with `config` (the load's JSON text; None: the entry as it is) applied."""
    if config is None:
        return entry
    name = entry.name

    def refuse(field: str, reason: str) -> LoadRefused:
        return LoadRefused(name, f"{CONFIG}.{field}" if field else CONFIG, reason)

    try:
        given = orjson.loads(config)
    except orjson.JSONDecodeError as exc:
        raise refuse("", f"not valid JSON ({exc})") from None
    if not isinstance(given, dict):
        raise refuse("", "must be a JSON object of the model's settings")
    fields = _ferry_fields(entry, given, refuse)
    merged = entry_fields(entry)
    _merge(merged, fields)
    try:
        return type(entry).model_validate(merged)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in setting_location(error["loc"]))
        raise refuse(where, str(error["msg"]).removeprefix("Value error, ")) from None


Refuse = Callable[[str, str], LoadRefused]


def entry_fields(entry: Entry) -> dict[str, Any]:
    """The fields the entry was given, as JSON values: validated again, the same entry."""
    fields = entry.model_dump(mode="json", exclude_unset=True)
    if isinstance(fields.get("batching"), dict):  # a dataclass: dumped whole
        for decided in BACKEND_DECIDED:
            fields["batching"].pop(decided, None)
    return fields


def entry_json(entry: Entry) -> str:
    """The entry as JSON (to another process: `entry_from_json`)."""
    kind = "llm" if isinstance(entry, LLMSettings) else "model"
    return orjson.dumps({"kind": kind, "fields": entry_fields(entry)}).decode()


def entry_from_json(text: str) -> Entry:
    given = orjson.loads(text)
    kind = LLMSettings if given["kind"] == "llm" else ModelSettings
    return kind.model_validate(given["fields"])


def _ferry_fields(entry: Entry, given: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
    """The config's fields as Ferry's: its own kept, Triton's mapped, the rest refused."""
    own = _settable(entry)
    fields: dict[str, Any] = {}
    for key, value in given.items():
        if key == "name":
            if value != entry.name:
                raise refuse(key, f"is {entry.name!r} (a load cannot rename a model)")
        elif key == "path":
            raise refuse(key, "a model's files are the repository's (a load cannot move them)")
        elif key == "backend" and isinstance(value, str):
            _check_backend(entry, value, refuse)
        elif isinstance(entry, LLMSettings) and (
            refused := foreign_option(given.get("engine", entry.engine), key)
        ):
            raise refuse(key, refused)
        elif key in ENTRY_ONLY:
            raise refuse(key, "is the entry's: a load cannot make a model stateful, or not")
        elif key in own:
            fields[key] = value
        elif isinstance(entry, ModelSettings) and key in TRITON_FIELDS:
            _merge(fields, TRITON_FIELDS[key](entry, value, refuse))
        else:
            known = sorted(own) + (
                sorted(TRITON_FIELDS) if isinstance(entry, ModelSettings) else []
            )
            raise refuse(key, f"not a setting Ferry can apply here; one of {', '.join(known)}")
    return fields


def _settable(entry: Entry) -> set[str]:
    """The keys of the entry's table a config may give: an LLM's engine options are flat keys."""
    fields = set(type(entry).model_fields) - set(FIXED) - set(ENTRY_ONLY)
    if isinstance(entry, LLMSettings):
        fields = fields - {"options"} | option_names()
    return fields


def _merge(fields: dict[str, Any], mapped: Mapping[str, Any]) -> None:
    """`mapped` into `fields`, tables merged one level down."""
    for key, value in mapped.items():
        old = fields.get(key)
        fields[key] = (
            {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
        )


def _check_backend(entry: Entry, value: str, refuse: Refuse) -> None:
    """Triton's `backend` (a string): only the one the model is served by."""
    kind = entry.backend.kind if isinstance(entry, ModelSettings) else entry.engine
    if value not in (kind, f"ferry_{kind}"):
        raise refuse("backend", f"{value!r} is not this model's backend ({kind!r})")


def _int(field: str, value: Any, refuse: Refuse) -> int:
    """A protobuf int64 as JSON gives it: a number or a string of one."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise refuse(field, f"must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise refuse(field, f"must be an integer, got {value!r}") from None


def _max_batch_size(entry: ModelSettings, value: Any, refuse: Refuse) -> dict[str, Any]:
    size = _int("max_batch_size", value, refuse)
    if size < 1:
        raise refuse(
            "max_batch_size",
            f"is {size}: Ferry always batches along the first axis; 1 runs one row at a time",
        )
    return {"batching": {"max_batch_size": size}}


def _dynamic_batching(entry: ModelSettings, value: Any, refuse: Refuse) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise refuse("dynamic_batching", "must be an object")
    batching: dict[str, Any] = {}
    fields: dict[str, Any] = {"batching": batching}
    for key, item in value.items():
        where = f"dynamic_batching.{key}"
        if key == "max_queue_delay_microseconds":
            batching["max_queue_delay_s"] = _int(where, item, refuse) / US_PER_S
        elif key == "default_queue_policy" and isinstance(item, dict):
            for policy, setting in item.items():
                at = f"{where}.{policy}"
                if policy == "default_timeout_microseconds":
                    fields["timeout_s"] = _int(at, setting, refuse) / US_PER_S
                elif policy == "max_queue_size":
                    batching["max_queue_size"] = _int(at, setting, refuse)
                elif policy == "timeout_action" and setting == "REJECT":
                    pass  # Ferry's only action: a request past its deadline is refused
                else:
                    raise refuse(
                        at,
                        "not a queue policy Ferry has (default_timeout_microseconds, "
                        "max_queue_size, timeout_action REJECT)",
                    )
        else:
            raise refuse(
                where,
                "not a dynamic batching setting Ferry has "
                "(max_queue_delay_microseconds, default_queue_policy)",
            )
    return fields


def _instance_group(entry: ModelSettings, value: Any, refuse: Refuse) -> dict[str, Any]:
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], dict):
        raise refuse("instance_group", "must be a list of one group (Ferry runs one)")
    group = value[0]
    unknown = set(group) - {"name", "kind", "count"}
    if unknown:
        raise refuse(f"instance_group[0].{sorted(unknown)[0]}", "not settable (name, kind, count)")
    backend: dict[str, Any] = {}
    kind = group.get("kind", "KIND_AUTO")
    if kind != "KIND_AUTO":
        if kind not in DEVICES or not hasattr(entry.backend, "device"):
            raise refuse(
                "instance_group[0].kind",
                f"{kind!r}: one of KIND_AUTO, KIND_CPU, KIND_GPU "
                "(the onnxruntime and torch backends)",
            )
        backend["device"] = DEVICES[kind]
    if "count" in group:
        count = _int("instance_group[0].count", group["count"], refuse)
        field = {"onnxruntime": "sessions", "triton": "concurrency"}.get(entry.backend.kind)
        if field is None:
            raise refuse("instance_group[0].count", f"the {entry.backend.kind} backend runs one")
        backend[field] = count
    return {"backend": backend} if backend else {}


def _same_as_served(
    field: str, reason: str
) -> Callable[[ModelSettings, Any, Refuse], dict[str, Any]]:
    def refused(entry: ModelSettings, value: Any, refuse: Refuse) -> dict[str, Any]:
        raise refuse(field, reason)

    return refused


def _platform(entry: ModelSettings, value: Any, refuse: Refuse) -> dict[str, Any]:
    if value not in ("", "onnxruntime_onnx") or entry.backend.kind != "onnxruntime":
        raise refuse("platform", f"{value!r} is not this model's platform")
    return {}


def _version_policy(entry: ModelSettings, value: Any, refuse: Refuse) -> dict[str, Any]:
    latest = value.get("latest") if isinstance(value, dict) else None
    if (
        len(value) != 1
        or not isinstance(latest, dict)
        or _int("version_policy.latest.num_versions", latest.get("num_versions", 1), refuse) != 1
    ):
        raise refuse(
            "version_policy", 'Ferry serves one version, 1: {"latest": {"num_versions": 1}}'
        )
    return {}


TRITON_FIELDS: dict[str, Callable[[ModelSettings, Any, Refuse], dict[str, Any]]] = {
    "max_batch_size": _max_batch_size,
    "dynamic_batching": _dynamic_batching,
    "instance_group": _instance_group,
    "platform": _platform,
    "version_policy": _version_policy,
    "input": _same_as_served("input", "a graph's inputs are read from the graph itself"),
    "output": _same_as_served("output", "a graph's outputs are read from the graph itself"),
}
