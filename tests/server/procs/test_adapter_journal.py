"""The adapter journal: what one engine process wrote, the next reads and is brought to."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.llm.errors import InvalidAdapter
from ferry.server.procs.adapter_journal import AdapterJournal, restore

pytestmark = pytest.mark.unit


class RecordingEngine:
    """The two engine calls `restore` makes, recorded; a path named `gone` fails to load."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def load_adapter(self, name: str, path: Path) -> None:
        if path.name == "gone":
            raise InvalidAdapter("lora_path", f"cannot load adapter {path}")
        self.calls.append(("load", name))

    async def unload_adapter(self, name: str) -> None:
        self.calls.append(("unload", name))


def test_the_journal_reads_back_what_was_written_and_is_empty_before(tmp_path):
    journal = AdapterJournal(tmp_path / "adapters.json")
    assert journal.read() == {}
    journal.write({"llm": {"zen": "/a/zen", "shout": "/a/shout"}})
    journal.write({"llm": {"shout": "/a/shout"}})
    assert AdapterJournal(tmp_path / "adapters.json").read() == {"llm": {"shout": "/a/shout"}}
    assert [p.name for p in tmp_path.iterdir()] == ["adapters.json"]  # no partial file left


async def test_restore_unloads_the_unwanted_and_loads_the_missing():
    engine = RecordingEngine()
    served = {"zen": "/cfg/zen", "calm": "/cfg/calm", "moved": "/cfg/moved"}
    wanted = {"calm": "/cfg/calm", "moved": "/run/moved", "shout": "/run/shout"}
    await restore(engine, served, wanted)
    # `moved` was unloaded and loaded again from its new path; `calm` was left alone.
    assert engine.calls == [
        ("unload", "zen"),
        ("unload", "moved"),
        ("load", "moved"),
        ("load", "shout"),
    ]
    assert served == wanted


async def test_an_adapter_that_no_longer_loads_is_left_out(caplog: pytest.LogCaptureFixture):
    engine = RecordingEngine()
    served: dict[str, str] = {}
    await restore(engine, served, {"lost": "/run/gone", "shout": "/run/shout"})
    assert served == {"shout": "/run/shout"}
    assert "adapter lost from /run/gone not restored" in caplog.text
