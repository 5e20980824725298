"""Which LoRA adapters an engine holds, who is using them, and when one may be freed.

Pure bookkeeping on the event loop, shared by the engines: each load gets a fresh integer id
(vLLM's `lora_int_id`; onnxruntime-genai's adapter key), so an adapter unloaded while its last
requests finish never clashes with a new load under the same name.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ferry.llm.errors import AdapterNotLoaded, InvalidAdapter


@dataclass
class _Slot:
    id: int
    users: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


class AdapterTable:
    def __init__(self, max_adapters: int) -> None:
        self.max_adapters = max_adapters
        self._by_name: dict[str, _Slot] = {}  # loaded and selectable by name
        self._by_id: dict[int, _Slot] = {}  # loaded, or unloaded by name but still in use
        self._pending: set[str] = set()  # being loaded
        self._next_id = 1

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def reserve(self, name: str) -> int:
        """A fresh id for a load about to start; `commit` or `cancel` it afterwards."""
        if name in self._by_name or name in self._pending:
            raise InvalidAdapter("lora_name", f"The LoRA adapter `{name}` is already loaded.")
        # Adapters still finishing requests after an unload hold memory too: they count.
        if len(self._by_id) + len(self._pending) >= self.max_adapters:
            raise InvalidAdapter(
                "lora_name", f"{self.max_adapters} LoRA adapters are loaded, the configured most."
            )
        self._pending.add(name)
        adapter_id, self._next_id = self._next_id, self._next_id + 1
        return adapter_id

    def commit(self, name: str, adapter_id: int) -> None:
        self._pending.discard(name)
        slot = _Slot(adapter_id)
        slot.idle.set()
        self._by_name[name] = self._by_id[adapter_id] = slot

    def cancel(self, name: str) -> None:
        self._pending.discard(name)

    def acquire(self, name: str) -> int:
        """Mark one request as using `name`; the id to run it with, for `release`."""
        slot = self._by_name.get(name)
        if slot is None:
            raise AdapterNotLoaded(name)
        slot.users += 1
        slot.idle.clear()
        return slot.id

    def release(self, adapter_id: int) -> None:
        slot = self._by_id.get(adapter_id)
        if slot is not None:
            slot.users -= 1
            if slot.users == 0:
                slot.idle.set()

    async def retire(self, name: str) -> int:
        """Stop new requests on `name` now; return its id once the requests using it ended."""
        slot = self._by_name.pop(name, None)
        if slot is None:
            raise AdapterNotLoaded(name)
        try:
            await slot.idle.wait()
        finally:
            del self._by_id[slot.id]
        return slot.id
