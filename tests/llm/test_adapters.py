"""AdapterTable: names, ids, limits, and an unload that waits for the requests using it."""

from __future__ import annotations

import asyncio

import pytest

from ferry.llm.adapters import AdapterTable
from ferry.llm.errors import AdapterNotLoaded, InvalidAdapter
from tests.llm.llm_paths import WAIT_S

pytestmark = pytest.mark.unit


def loaded(table: AdapterTable, name: str) -> int:
    adapter_id = table.reserve(name)
    table.commit(name, adapter_id)
    return adapter_id


async def test_names_ids_and_limits() -> None:
    table = AdapterTable(max_adapters=2)
    first = loaded(table, "a")
    pending = table.reserve("b")
    assert table.names() == ["a"]  # a load in progress is not selectable yet
    with pytest.raises(InvalidAdapter) as taken:
        table.reserve("b")
    assert taken.value.field == "lora_name"
    with pytest.raises(InvalidAdapter, match="2 LoRA adapters"):
        table.reserve("c")
    table.cancel("b")  # a failed load frees its place
    assert loaded(table, "c") not in (first, pending)
    with pytest.raises(AdapterNotLoaded):
        table.acquire("b")


async def test_retire_waits_for_every_user_and_counts_until_then() -> None:
    table = AdapterTable(max_adapters=1)
    adapter_id = loaded(table, "a")
    users = [table.acquire("a"), table.acquire("a")]
    retire = asyncio.create_task(table.retire("a"))
    await asyncio.sleep(0)
    with pytest.raises(AdapterNotLoaded):
        table.acquire("a")  # gone for new requests at once
    with pytest.raises(InvalidAdapter):
        table.reserve("a")  # still holds its memory: the limit counts it
    table.release(users[0])
    await asyncio.sleep(0)
    assert not retire.done()
    table.release(users[1])
    assert await asyncio.wait_for(retire, WAIT_S) == adapter_id
    assert loaded(table, "a") != adapter_id  # reloaded under a fresh id


async def test_retire_of_an_idle_adapter_is_immediate() -> None:
    table = AdapterTable(max_adapters=4)
    adapter_id = loaded(table, "a")
    assert await asyncio.wait_for(table.retire("a"), WAIT_S) == adapter_id
    with pytest.raises(AdapterNotLoaded):
        await table.retire("a")
