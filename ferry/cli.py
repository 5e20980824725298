"""The `ferry` command, on top of every package: `ferry serve`, `ferry export ...`, `ferry bench`.

Each package adds its own subcommands; only this module knows them all, so the server never
imports the exporters or the benchmarks. bench/cli.py is imported only when `ferry bench` runs
(or the whole parser is asked for, as the docs are): `ferry serve` never loads the benchmarks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ferry.exporters.cli import add_export_commands
from ferry.server.cli import add_serve_command

BENCH_SUMMARY = "Sweep concurrency against a running server; print and plot latency vs throughput."


def build_parser(bench: bool = True) -> argparse.ArgumentParser:
    """The `ferry` command. With bench=False, `ferry bench` is listed without its options, so
    that running another command never imports the benchmarks."""
    parser = argparse.ArgumentParser(
        prog="ferry",
        description="Ferry: async model serving with dynamic micro-batching.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_command(commands)
    add_export_commands(commands)
    if bench:
        from ferry.bench.cli import add_bench_command

        add_bench_command(commands, BENCH_SUMMARY)
    else:
        commands.add_parser("bench", help=BENCH_SUMMARY)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(bench=argv[:1] == ["bench"]).parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
