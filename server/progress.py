"""Progress of long work (an export, loading the models): a bar with an ETA on a terminal
(tqdm), and one line per finished step anywhere else (a log file, CI, a pipe), where a bar's
carriage returns would be noise.

Steps carry weights, their expected share of the whole (a model's conversion is longer than its
tokenizer check): the ETA is the time spent per unit of weight so far times the weight left,
the same in both forms.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

Emit = Callable[[str], None]  # where a line goes when there is no terminal


def on_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


class Progress:
    """`total`: the sum of the weights of the steps to come. `stream`: the terminal a bar is
    drawn on when it is one; otherwise each step's line goes to `emit` (default: a line on
    `stream`). `clock`: injectable for tests."""

    def __init__(
        self,
        label: str,
        total: float,
        *,
        stream: TextIO | None = None,
        emit: Emit | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0.0
        self.steps_done = 0
        self._clock = clock
        self._started = clock()
        stream = sys.stderr if stream is None else stream
        self._emit = emit or (lambda line: print(line, file=stream, flush=True))
        self._bar: tqdm[None] | None = None
        if on_terminal(stream):
            self._bar = tqdm(
                total=total,
                desc=label,
                file=stream,
                smoothing=0,  # the mean rate: the steps are of different kinds
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}",
            )

    def eta_s(self) -> float | None:
        """Seconds left at the rate so far; None before any weight is done."""
        if self.done <= 0:
            return None
        spent = self._clock() - self._started
        return spent / self.done * max(self.total - self.done, 0.0)

    @contextmanager
    def step(self, what: str, weight: float = 1.0) -> Iterator[None]:
        """A step of `weight`, advanced when it ends (and said to have failed if it raises)."""
        if self._bar is not None:
            self._bar.set_postfix_str(what)
        started = self._clock()
        try:
            yield
        except BaseException:
            self._line(f"{what} failed after {duration(self._clock() - started)}")
            raise
        self.advance(weight, what, self._clock() - started)

    def advance(self, weight: float, what: str, seconds: float | None = None) -> None:
        """`weight` more done: `what` (a model loaded, a prompt compared), `seconds` its time."""
        self.done += weight
        self.steps_done += 1
        if self._bar is not None:
            self._bar.update(weight)
            return
        took = f" in {duration(seconds)}" if seconds is not None else ""
        eta = self.eta_s()
        left = f", about {duration(eta)} left" if eta is not None and self.done < self.total else ""
        share = f"{min(self.done / self.total, 1.0):.0%}" if self.total > 0 else "100%"
        self._line(f"{what}{took} ({share}{left})")

    def _line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(f"{self.label}: {text}")
        else:
            self._emit(f"{self.label}: {text}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def loading_progress(models: int) -> Progress:
    """Loading the models: a bar on a terminal, else a log line as each is ready (in the
    server's log format, so JSON logs stay JSON)."""
    logger = logging.getLogger("ferry.server.loading")
    return Progress("loading models", models, emit=logger.info)
