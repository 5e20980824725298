"""server/progress.py: one line per step where there is no terminal (with its share and the time
left), a bar where there is one, and the model registry telling it as each model is ready."""

from __future__ import annotations

import asyncio
import io

import pytest

from ferry.server.progress import Progress, duration
from ferry.server.registry import ModelRegistry

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_each_step_is_one_line_with_its_share_and_the_time_left():
    lines: list[str] = []
    clock = Clock()
    with Progress("export", 4, stream=io.StringIO(), emit=lines.append, clock=clock) as progress:
        with progress.step("converting", 1):
            clock.now += 2
        with progress.step("comparing", 3):
            clock.now += 9
    # 1 of 4 took 2 s: 3 more at that rate are 6 s; the last line has nothing left.
    assert lines == [
        "export: converting in 2.0s (25%, about 6.0s left)",
        "export: comparing in 9.0s (100%)",
    ]


def test_a_failed_step_says_so_and_advances_nothing():
    lines: list[str] = []
    clock = Clock()
    progress = Progress("export", 2, stream=io.StringIO(), emit=lines.append, clock=clock)
    with pytest.raises(ValueError), progress.step("converting"):
        clock.now += 1.5
        raise ValueError("unconvertible")
    assert lines == ["export: converting failed after 1.5s"]
    assert progress.done == 0


def test_lines_go_to_the_stream_when_no_one_takes_them():
    stream = io.StringIO()
    with Progress("export", 1, stream=stream) as progress, progress.step("writing"):
        pass
    assert stream.getvalue().startswith("export: writing in ") and "\r" not in stream.getvalue()


def test_on_a_terminal_a_bar_with_the_time_left_and_no_lines():
    terminal, lines = Terminal(), []
    with (
        Progress("export", 2, stream=terminal, emit=lines.append) as progress,
        progress.step("converting"),
    ):
        pass
    drawn = terminal.getvalue()
    # Redrawn in place, half done after one of two steps, with elapsed<remaining and the step.
    assert "\r" in drawn and "export:  50%" in drawn and "00:00<00:00, converting" in drawn
    assert lines == []


@pytest.mark.parametrize(("seconds", "said"), [(0.04, "0.0s"), (59.9, "59.9s"), (125, "2m05s")])
def test_durations_read_as_a_person_says_them(seconds, said):
    assert duration(seconds) == said


class Loading:
    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate

    async def start(self) -> None:
        if self.gate is not None:
            await self.gate.wait()


async def test_the_registry_tells_the_progress_as_each_model_is_ready():
    gate = asyncio.Event()
    registry = ModelRegistry({"fast": Loading(), "slow": Loading(gate)})  # type: ignore[dict-item]
    lines: list[str] = []
    progress = Progress("loading models", registry.loads(), stream=io.StringIO(), emit=lines.append)
    starting = asyncio.create_task(registry.start(progress))
    while not lines:  # the fast one is told while the slow one still loads
        await asyncio.sleep(0)
    assert [line.partition(" in ")[0] for line in lines] == ["loading models: fast ready"]
    gate.set()
    await starting
    assert lines[1].startswith("loading models: slow ready in ") and lines[1].endswith("(100%)")
