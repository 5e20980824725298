"""What one batch costs the backend, measured once, so a replay needs no quiet machine.

`measure` times a 1-thread ONNX Runtime session of the model (the server's layout: one such
session per core, batches side by side) over a grid of batch sizes and padded lengths. It reads
the process's CPU time, not the wall clock: a 1-thread run's CPU time is what it costs a core of
its own, and other work on a shared machine stretches only the wall time. The fastest of a few
runs of each shape is kept.
`CostTable` answers any shape by interpolating that grid linearly in size and length.

python -m ferry.bench.replay_costs [--out bench/replay_costs.json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ferry.bench.server_process import DEFAULT_MODEL_DIR

SIZES = (1, 2, 4, 8, 16, 32)
LENGTHS = (8, 16, 32, 64, 96, 128)
RUNS = 3
DEFAULT_TABLE = Path(__file__).with_name("replay_costs.json")


@dataclass(frozen=True)
class CostTable:
    sizes: tuple[int, ...]
    lengths: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]  # [size index][length index]

    def __call__(self, n: int, length: int) -> float:
        """Seconds for `n` sequences padded to `length` tokens (linear between grid points)."""
        i, fi = _bracket(self.sizes, n)
        j, fj = _bracket(self.lengths, length)
        s = self.seconds
        low = s[i][j] + (s[i][j + 1] - s[i][j]) * fj
        high = s[i + 1][j] + (s[i + 1][j + 1] - s[i + 1][j]) * fj
        return max(1e-6, low + (high - low) * fi)

    def to_json(self) -> dict:
        return {"sizes": self.sizes, "lengths": self.lengths, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict) -> CostTable:
        seconds = tuple(tuple(float(v) for v in row) for row in data["seconds"])
        return cls(tuple(data["sizes"]), tuple(data["lengths"]), seconds)

    @classmethod
    def load(cls, path: Path = DEFAULT_TABLE) -> CostTable:
        return cls.from_json(json.loads(path.read_text()))


def _bracket(grid: tuple[int, ...], value: int) -> tuple[int, float]:
    """The grid cell holding `value` and how far into it (beyond the ends: extrapolated)."""
    i = min(max(bisect.bisect_right(grid, value) - 1, 0), len(grid) - 2)
    return i, (value - grid[i]) / (grid[i + 1] - grid[i])


def measure(model_dir: Path = DEFAULT_MODEL_DIR, runs: int = RUNS) -> CostTable:
    from ferry.backends.ort_session import cpu_session

    session = cpu_session(model_dir / "model.onnx", 1)
    rng = np.random.default_rng(0)
    seconds = []
    for n in SIZES:
        row = []
        for length in LENGTHS:
            ids = rng.integers(2000, 29000, size=(n, length), dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            session.run(["sentence_embedding"], feeds)  # the first run of a shape allocates
            best = float("inf")
            for _ in range(runs):
                started = time.process_time()
                session.run(["sentence_embedding"], feeds)
                best = min(best, time.process_time() - started)
            row.append(round(best, 6))
        seconds.append(tuple(row))
    return CostTable(SIZES, LENGTHS, tuple(seconds))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--out", type=Path, default=DEFAULT_TABLE)
    args = parser.parse_args(argv)
    table = measure(args.model_dir)
    args.out.write_text(json.dumps(table.to_json(), indent=1) + "\n")
    for n, row in zip(table.sizes, table.seconds, strict=True):
        print(f"n={n:3d} " + " ".join(f"{s * 1000:8.2f}" for s in row) + "  ms")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
