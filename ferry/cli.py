"""The `ferry` command, on top of every package: `ferry serve`, `ferry export ...`, `ferry bench`.

Each package adds its own subcommands; only this module knows them all, so the server never
imports the exporters or the benchmarks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ferry.bench.cli import add_bench_command
from ferry.exporters.cli import add_export_commands
from ferry.server.cli import add_serve_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry",
        description="Ferry: async model serving with dynamic micro-batching.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_command(commands)
    add_export_commands(commands)
    add_bench_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
