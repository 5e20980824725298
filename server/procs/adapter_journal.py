"""The LoRA adapters each LLM serves, on disk, so that a restarted engine process serves the same.

The supervisor restarts an engine process that dies; without this, adapters loaded at runtime
(POST /v1/load_lora_adapter) would vanish with it and configured ones unloaded at runtime would
come back, while clients had been told otherwise. The engine process writes the whole set after
each change and replays it once its models are up, before any API process can reach it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Protocol, cast

logger = logging.getLogger(__name__)

# Per LLM: adapter name -> the path it was loaded from.
AdapterSets = dict[str, dict[str, str]]


class AdapterEngine(Protocol):
    async def load_adapter(self, name: str, path: Path) -> None: ...

    async def unload_adapter(self, name: str) -> None: ...


class AdapterJournal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> AdapterSets:
        """What the last engine process served; empty before any engine wrote it."""
        try:
            return cast(AdapterSets, json.loads(self.path.read_text()))
        except FileNotFoundError:
            return {}

    def write(self, adapters: AdapterSets) -> None:
        # Replaced whole, never half-written: a process killed mid-write leaves the old set.
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(adapters))
        os.replace(partial, self.path)


async def restore(engine: AdapterEngine, served: dict[str, str], wanted: dict[str, str]) -> None:
    """Bring `engine` from `served` (updated in place) to `wanted`. An adapter that no longer
    loads (its file removed meanwhile) is logged and left out: the engine still starts."""
    for name in [n for n in served if wanted.get(n) != served[n]]:
        await engine.unload_adapter(name)
        del served[name]
    for name, path in wanted.items():
        if name in served:
            continue
        try:
            await engine.load_adapter(name, Path(path))
        except Exception as exc:
            logger.warning("adapter %s from %s not restored: %s", name, path, exc)
        else:
            served[name] = path
