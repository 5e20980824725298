"""The `ferry` command: `ferry serve`, `ferry export ...`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry",
        description="Ferry: async model serving with dynamic micro-batching.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="Serve the configured models over HTTP.",
        description="Serve the models of a config file (TOML or YAML). Environment variables "
        "override the file: FERRY_<FIELD> for server fields, FERRY_MODEL__<NAME>__<FIELD> for a "
        "model's fields.",
    )
    serve.add_argument(
        "--config",
        type=Path,
        default=None,
        help="Config file (TOML or YAML); default: $FERRY_CONFIG, else no models.",
    )
    serve.add_argument("--host", default=None, help="Address to bind (default 127.0.0.1).")
    serve.add_argument("--port", type=int, default=None, help="Port to bind (default 8000).")
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=None,
        help="Log verbosity (default info).",
    )
    serve.set_defaults(handler=_serve)

    from ferry.bench.cli import add_bench_command
    from ferry.exporters.cli import add_export_commands

    add_export_commands(commands)
    add_bench_command(commands)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from ferry.server.app import create_app
    from ferry.server.serve import serve
    from ferry.server.settings import load_settings

    settings = load_settings(args.config, host=args.host, port=args.port, log_level=args.log_level)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.api_servers > 1:
        from ferry.server.procs.supervisor import run

        return run(settings)
    serve(create_app(settings), settings)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
