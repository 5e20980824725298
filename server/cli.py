"""`ferry serve`: the server's subcommand of the `ferry` command (ferry/cli.py)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def add_serve_command(commands: argparse._SubParsersAction) -> None:
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
