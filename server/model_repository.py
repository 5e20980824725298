"""Triton's model repository extension: which models the server may serve, which it serves now,
and loading and unloading them while it runs (POST /v2/repository/index, .../load, .../unload
over HTTP and gRPC).

Ferry's repository is its config: the `models` and `llm_models` entries of the file it was
started with (and `ferry serve --model`). Each entry is what a Triton model folder is (the
model's files, found at `path`, and its configuration, the entry's settings), so an ONNX graph,
a token encoder and an LLM are loaded and unloaded alike, with the settings the file gives them.
How the repository is used is `model_control_mode`, as Triton's `--model-control-mode`:

- "none": every entry is served from start to end; load and unload are refused.
- "explicit": only `load_models` are served at start ("*": every entry); a load reads the
  file again and serves the entry of that name as it is now (with a load's config override
  applied), an unload stops serving it.
- "poll": every entry is served at start, and the file is read again every
  `repository_poll_secs`: entries added are loaded, entries changed reloaded, entries removed
  unloaded. Load and unload are refused (the file is the only control, as in Triton).

A load or unload of one model runs beside every other model's requests (registry.py builds a
model off the event loop); two of the same model run one after the other.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ferry.server.errors import (
    Forbidden,
    LoadFailed,
    LoadRefused,
    ModelControlOff,
    NotInRepository,
)
from ferry.server.kserve.versions import VERSION
from ferry.server.metrics import FerryMetrics
from ferry.server.model_overrides import CONFIG, Entry, with_config
from ferry.server.registry import ModelRegistry
from ferry.server.settings import Settings

logger = logging.getLogger(__name__)

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
UNLOADED = "unloaded"  # Triton's reason for a model unloaded on request
# Triton's sentence, for "none" and "poll" alike; its clients look for it.
CONTROL_OFF = "explicit model load / unload is not allowed if polling is enabled"
FILE_PREFIX = "file:"  # Triton's file overrides: "file:<version>/<name>" parameters


@dataclass(frozen=True)
class IndexEntry:
    """A model as Triton's index lists it: a model never loaded has its name alone."""

    name: str
    version: str = ""
    state: str = ""
    reason: str = ""

    def as_json(self) -> dict[str, str]:
        fields = {"version": self.version, "state": self.state, "reason": self.reason}
        return {"name": self.name, **{k: v for k, v in fields.items() if v}}


class ModelRepository:
    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        metrics: FerryMetrics,
        on_change: Callable[[Mapping[str, Entry]], Awaitable[None]] | None = None,
    ) -> None:
        self._settings = settings
        self._on_change = on_change  # after a poll changed what is served
        self._registry = registry
        self._metrics = metrics
        self.entries = repository_entries(settings)
        # A name's state after a load or unload asked here (its reason: why it is unavailable).
        self._states: dict[str, tuple[str, str]] = {}
        self._seen: set[str] = set()  # names served at some time: Triton lists their state
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._poller: asyncio.Task[None] | None = None

    @property
    def mode(self) -> str:
        return self._settings.model_control_mode

    # -- index ------------------------------------------------------------------------------------

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model of the repository, loaded or not, with its state. Unless the mode is
        "none", the file is read again first, as Triton scans its repository for each index
        (with api_servers > 1, an API process's own reading in poll mode)."""
        if self.mode != "none":
            try:
                self.entries = await self._read_entries()
            except LoadFailed as exc:
                logger.warning("model repository index: %s; listed as last read", exc)
        served = self._registry.readiness()
        self._seen.update(name for name in served if name in self.entries)
        listed = []
        for name in sorted(self.entries):
            state, reason = self._states.get(name, ("", ""))
            if state in (LOADING, UNLOADING):
                pass  # asked here, under way
            elif name in served:
                state, reason = (READY, "") if served[name] else (UNAVAILABLE, "not ready")
            elif name in self._seen:  # unloaded (here, by another API process, or a poll)
                state, reason = UNAVAILABLE, reason if state == UNAVAILABLE else UNLOADED
            entry = IndexEntry(name, VERSION, state, reason) if state else IndexEntry(name)
            if not ready_only or entry.state == READY:
                listed.append(entry)
        return listed

    # -- explicit control -------------------------------------------------------------------------

    async def load(self, name: str, config: str | None, files: Sequence[str] = ()) -> None:
        """Serve `name` with the repository's entry as it is now (a reload if served), with
        `config` (a load's override) applied; returns once it is ready."""
        self._check_explicit()
        if files:  # refused before the file is read again: nothing about it could be honoured
            raise LoadRefused(
                name,
                f"parameters.{files[0]}",
                "file overrides are not supported: Ferry loads a model from the files its "
                "repository entry's path names",
            )
        entries = await self._read_entries()
        if name not in entries:
            raise NotInRepository("load", name)
        self.entries = entries
        entry = with_config(entries[name], config)  # refused here: nothing started yet
        await self._load(entry, CONFIG if config is not None else "model")

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Stop serving `name` once its requests in flight finished. An LLM's LoRA adapters go
        with it whatever `unload_dependents` says: an adapter has no life without its base."""
        self._check_explicit()
        if name not in self.entries:
            raise NotInRepository("unload", name)
        await self._unload(name)

    def _check_explicit(self) -> None:
        if self.mode != "explicit":
            raise ModelControlOff(
                f"{CONTROL_OFF} (model_control_mode is '{self.mode}'; "
                "start with --model-control-mode explicit to load and unload models)"
            )

    async def _read_entries(self) -> dict[str, Entry]:
        try:
            settings = await asyncio.to_thread(self._settings.reread)
        except Exception as exc:  # a broken file: the server's fault, not the request's
            raise LoadFailed(
                f"the model repository (the config file) cannot be read: {exc}"
            ) from exc
        return repository_entries(settings)

    async def _load(self, entry: Entry, field: str) -> None:
        name = entry.name
        async with self._locks[name]:
            was_served = name in self._registry.readiness()
            self._states[name] = (LOADING, "")
            try:
                await self._registry.load(entry)
            except Exception as exc:
                reason = f"failed to load '{name}': {exc}"
                self._states[name] = (UNAVAILABLE, reason)
                if not was_served and name not in self._registry.readiness():
                    self._metrics.forget_model(name)
                if isinstance(exc, ValueError):  # settings the model refused at start
                    raise LoadRefused(name, field, str(exc)) from exc
                logger.exception("model %r failed to load", name)
                raise LoadFailed(reason) from exc
            self._states[name] = (READY, "")
            self._seen.add(name)
            logger.info("model %r loaded", name)

    async def _unload(self, name: str) -> None:
        async with self._locks[name]:
            llm = self._registry.llms.get(name)
            adapters = llm.adapter_names() if llm is not None else []
            self._states[name] = (UNLOADING, "")
            try:
                unloaded = await self._registry.unload(name)
            finally:
                self._states[name] = (UNAVAILABLE, UNLOADED)
            # Its series (and its adapters') go with it: /metrics shows served models only.
            for gone in (name, *adapters):
                self._metrics.forget_model(gone)
            if unloaded:
                logger.info("model %r unloaded", name)

    # -- poll -------------------------------------------------------------------------------------

    def start(self, poll: bool = True) -> None:
        """`poll`: this process reads the repository in poll mode (with api_servers > 1 the
        engine process does, once for all, and tells the API processes what changed)."""
        if self.mode == "poll" and poll:
            self._poller = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self._settings.repository_poll_secs)
            await self.poll()

    async def poll(self) -> None:
        """Read the repository again: what it added is loaded, changed reloaded, removed
        unloaded. A file that cannot be read changes nothing (logged)."""
        try:
            entries = await self._read_entries()
        except LoadFailed as exc:
            logger.warning("model repository poll: %s; nothing changed", exc)
            return
        old, self.entries = self.entries, entries
        changed = False
        for name in old.keys() - entries.keys():
            await self._unload(name)
            changed = True
        for name, entry in entries.items():
            if old.get(name) != entry or name not in self._registry.readiness():
                changed = True
                try:
                    await self._load(entry, "model")
                except (LoadFailed, LoadRefused) as exc:
                    logger.warning("model repository poll: %s", exc)
        if changed and self._on_change is not None:
            await self._on_change(self.entries)


def check_tenant_right(settings: Settings, tenant: str | None) -> None:
    """With API keys set, only the keys `model_control_keys` names (or all, "*") load and
    unload models: one serves every tenant (403 otherwise)."""
    if not settings.tenant_keys or "*" in settings.model_control_keys:
        return
    if tenant not in settings.model_control_keys:
        raise Forbidden(
            "model", f"API key {tenant!r} may not load or unload models (model_control_keys)"
        )


def repository_entries(settings: Settings) -> dict[str, Entry]:
    """Every model the repository holds, by name."""
    entries: dict[str, Entry] = {m.name: m for m in settings.models}
    return entries | {m.name: m for m in settings.llm_models}


def load_parameters(model: str, parameters: dict[str, Any]) -> tuple[str | None, list[str]]:
    """A load's `config` (JSON text, or None) and the names of its file overrides; any other
    parameter is refused, naming it."""
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise LoadRefused(model, CONFIG, "must be a string of JSON (the model's settings)")
    files = [key for key in parameters if key.startswith(FILE_PREFIX)]
    unknown = sorted(set(parameters) - {"config", *files})
    if unknown:
        raise LoadRefused(
            model, f"parameters.{unknown[0]}", "not a load parameter (config, file:<path>)"
        )
    return config, files


def unload_parameters(model: str, parameters: dict[str, Any]) -> bool:
    """An unload's `unload_dependents` (a boolean); any other parameter is refused."""
    unknown = sorted(set(parameters) - {"unload_dependents"})
    if unknown:
        raise LoadRefused(
            model,
            f"parameters.{unknown[0]}",
            "not an unload parameter (unload_dependents)",
            "unload",
        )
    value = parameters.get("unload_dependents", False)
    if not isinstance(value, bool):
        raise LoadRefused(model, "parameters.unload_dependents", "must be a boolean", "unload")
    return value
