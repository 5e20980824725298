"""Closed-loop load from wrk (C, epoll, one thread): a load generator that leaves the cores to
the server.

bench/loadgen.py is Python: on the 2-core box it spends about as much CPU a request as the
server's front end does, so a server that could use both cores never gets the second (two
replicas on the null backend read 0.87x of one with it, 2.3x with wrk in a first try). wrk sends
the same pre-encoded JSON bodies, `concurrency` connections each with one request in flight; a
Lua script cycles through the bodies and writes the totals and every percent's latency on one
line when it ends. A non-2xx answer, a socket error and a timeout all count as failed.

Debian's package (tools/install_wrk.sh); `closed_loop` falls back to bench/loadgen.py where wrk
is missing, and says so.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ferry.bench.loadgen import LoadResult, run_load

# Every percent's midpoint: enough to rebuild the distribution (`as_load_result`).
PERCENTILES = tuple(q + 0.5 for q in range(100))
MARK = "WRK_TOTALS"
# At the end: requests, microseconds, failed, then the latency percentiles in microseconds.
_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  local failed = e.status + e.connect + e.read + e.write + e.timeout
  io.write("%s ", summary.requests, " ", summary.duration, " ", failed)
  for _, q in ipairs({%s}) do io.write(" ", latency:percentile(q)) end
  io.write("\\n")
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


@dataclass
class WrkResult:
    """What bench/loadgen.LoadResult offers the benchmarks: rate, statuses, percentiles."""

    requests: int = 0
    failed: int = 0
    elapsed_s: float = 0.0
    percentiles_ms: dict[float, float] = field(default_factory=dict)

    @property
    def completed(self) -> int:
        return self.requests - self.failed

    @property
    def throughput(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def statuses(self) -> dict[int, int]:
        """200 for every answered request, 0 for the failed (wrk does not tell which status)."""
        return {200: self.completed, **({0: self.failed} if self.failed else {})}

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.as_load_result().latencies_s, q) * 1000)

    def as_load_result(self) -> LoadResult:
        """The same run as bench/loadgen's result: each percent of the answered requests at its
        midpoint's latency (wrk keeps a histogram, not each request), so results of several
        runs merge (bench/loadgen.merge) as their requests' distributions, to a percent."""
        share, extra = divmod(self.completed, len(PERCENTILES))
        latencies = []
        for index, q in enumerate(PERCENTILES):
            latencies += [self.percentiles_ms[q] / 1000] * (share + (index < extra))
        return LoadResult(latencies, self.statuses, self.elapsed_s)


def script(bodies: list[dict]) -> str:
    """The Lua script: POST each body in turn, then the totals (`done`)."""
    encoded = [json.dumps(body) for body in bodies]
    # Lua's long brackets, of a level no body closes: the bodies go in verbatim.
    level = "="
    while any(f"]{level}]" in text for text in encoded):
        level += "="
    quoted = ",\n".join(f"[{level}[{text}]{level}]" for text in encoded)
    return (
        f"local bodies = {{\n{quoted}\n}}\nlocal i = 0\n"
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        "request = function()\n  i = i % #bodies + 1\n"
        "  return wrk.format(nil, nil, nil, bodies[i])\nend\n"
        + _DONE
        % (MARK, ", ".join(str(q) for q in PERCENTILES))
    )


def run_wrk(
    url: str, bodies: list[dict], concurrency: int, path: str, duration_s: float
) -> WrkResult:
    with tempfile.TemporaryDirectory() as work:
        lua = Path(work) / "load.lua"
        lua.write_text(script(bodies))
        command = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration_s))}s"]
        command += ["--timeout", "60s", "-s", str(lua), url.rstrip("/") + path]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    line = next((x for x in out.splitlines() if x.startswith(MARK)), None)
    if line is None:
        raise RuntimeError(f"wrk printed no totals:\n{out}")
    requests, duration_us, failed, *percentiles = (float(x) for x in line.split()[1:])
    return WrkResult(
        int(requests),
        int(failed),
        duration_us / 1e6,
        {q: us / 1000 for q, us in zip(PERCENTILES, percentiles, strict=True)},
    )


def closed_loop(
    url: str,
    bodies: list[dict],
    concurrency: int,
    path: str,
    duration_s: float,
    generator: str = "wrk",
) -> LoadResult:
    """`concurrency` closed-loop clients for `duration_s` from `generator` ("wrk" or "python";
    wrk where it is installed), as bench/loadgen's result either way."""
    if generator == "wrk" and available():
        return run_wrk(url, bodies, concurrency, path, duration_s).as_load_result()
    if generator == "wrk":
        print("wrk is not installed (tools/install_wrk.sh): the Python load generator instead")
    return asyncio.run(run_load(url, bodies, concurrency, path, duration_s))
