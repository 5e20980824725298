"""Where a server's RSS goes after hostile traffic: each kind of request in turn, RSS after each.

    .venv/bin/python -m ferry.bench.rss_by_request

Starts `ferry serve` with the default model on a free port, sends each kind a few times and
prints the process's RSS and the change; the last kind repeats an earlier one, so a cache (flat
on repeat) tells itself from a leak (growing again). Environment variables such as
MALLOC_ARENA_MAX reach the server: compare runs with and without them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from ferry.bench.server_process import default_model_config, ferry_server

ROW = [101] + [7592] * 254 + [102]  # 256 tokens, the default model's limit
KINDS: tuple[tuple[str, bytes, int], ...] = (
    ("10k-deep JSON", b'{"inputs": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", 20),
    ("2 MiB model name", json.dumps({"model": "x" * 2**21, "inputs": "x"}).encode(), 10),
    ("3.9 MB text over the char bound", json.dumps({"inputs": ["a " * 1_950_000]}).encode(), 5),
    ("8 rows of 256 tokens", json.dumps({"input_ids": [ROW] * 8}).encode(), 3),
    ("32 rows of 256 tokens", json.dumps({"input_ids": [ROW] * 32}).encode(), 3),
    (
        "64 long texts, truncated",
        json.dumps({"inputs": ["word " * 3000] * 64, "truncate": True}).encode(),
        2,
    ),
    ("32 rows of 256 tokens, again", json.dumps({"input_ids": [ROW] * 32}).encode(), 3),
)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main() -> int:
    headers = {"content-type": "application/json"}
    with (
        ferry_server([default_model_config()], server={"max_items_per_request": 256}) as server,
        httpx.Client(base_url=server.url, timeout=300, headers=headers) as client,
    ):
        assert server.pid is not None
        client.post("/predict", json={"inputs": "warm up"}).raise_for_status()
        last = rss_mib(server.pid)
        print(f"{'start':40s} {last:7.0f} MiB")
        for name, body, times in KINDS:
            for _ in range(times):
                client.post("/predict", content=body)
            now = rss_mib(server.pid)
            print(f"{f'{name} x{times}':40s} {now:7.0f} MiB ({now - last:+.0f})")
            last = now
    return 0


if __name__ == "__main__":
    sys.exit(main())
