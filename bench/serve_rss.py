"""The server's RSS with `make serve`'s configuration, after a few requests to each model.

    .venv/bin/python -m ferry.bench.serve_rss [--config ferry.toml] [--requests 5] [--echo]

Starts `ferry serve --config CONFIG` on a free port, sends each LLM a few short chats and each
encoder a few /predict requests, and prints the server process's RSS (and its children's, the
grammar checkers). `--echo` then sends one `echo` completion with `logprobs` per LLM: the request
that once loaded an LLM's second copy of the weights (og.Model, for the generator lane); the
batch lane serves it now, so the RSS should not grow.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import httpx

from ferry.bench.processes import running
from ferry.bench.rss_by_request import rss_mib
from ferry.bench.server_process import REPO, FerryProcess
from ferry.server.settings import load_settings


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *children(int(child))]
    return found


def report(label: str, pid: int) -> None:
    kids = [round(rss_mib(child)) for child in children(pid)]
    print(f"{label:32s} server {rss_mib(pid):6.0f} MiB  children {kids} MiB", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "ferry.toml")
    parser.add_argument("--requests", type=int, default=5, help="per model")
    parser.add_argument("--echo", action="store_true", help="then one echo request per LLM")
    args = parser.parse_args(argv)
    settings = load_settings(args.config.resolve())
    with (
        tempfile.TemporaryDirectory() as tmp,
        running(FerryProcess(args.config.resolve(), Path(tmp) / "server.log"), 300) as server,
        httpx.Client(base_url=server.url, timeout=300) as client,
    ):
        assert server.pid is not None
        report("ready", server.pid)
        for i in range(args.requests):
            for llm in settings.llm_models:
                chat = [{"role": "user", "content": f"Tell me about bees ({i})."}]
                body = {"model": llm.name, "messages": chat, "max_tokens": 32}
                client.post("/v1/chat/completions", json=body).raise_for_status()
            for model in settings.models:
                body = {"model": model.name, "inputs": ["hello world"] * 8}
                client.post("/predict", json=body).raise_for_status()
        report(f"after {args.requests} requests each", server.pid)
        if args.echo:
            for llm in settings.llm_models:
                # Echo without logprobs is the prompt's text, added by serving: no engine work.
                body = {"model": llm.name, "prompt": "Bees make", "max_tokens": 1, "echo": True}
                body["logprobs"] = 1
                client.post("/v1/completions", json=body).raise_for_status()
            report("after an echo request each", server.pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
