"""The `ferry` command, on top of every package: `ferry serve`, `ferry export ...`, `ferry bench`.

Each package adds its own subcommands; only this module knows them all, so the server never
imports the exporters or the benchmarks. `ferry bench` parses its own arguments (bench/cli.py),
imported only when that command runs: `ferry serve` and `ferry export` never load the benchmarks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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
    # Listed here for `ferry --help`; main() hands its arguments to bench/cli.py.
    commands.add_parser(
        "bench",
        help="Sweep concurrency against a running server; print and plot latency vs throughput.",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from ferry.bench.cli import main as bench

        return bench(argv[1:])
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
