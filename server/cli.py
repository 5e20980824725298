"""`ferry serve`: the server's subcommand of the `ferry` command (ferry/cli.py)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferry.server.settings import Settings


def add_serve_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    serve.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="Serve a model with no config file: an .onnx file or a model folder; NAME "
        "defaults to the file's stem. Repeatable; added to the config file's models.",
    )
    serve.add_argument("--host", default=None, help="Address to bind (default 127.0.0.1).")
    serve.add_argument("--port", type=int, default=None, help="Port to bind (default 8000).")
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=None,
        help="Log verbosity (default info).",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        default=None,
        help="Triton's model control: none (default; every model served, load/unload "
        "refused), explicit (only --load-model at start; POST /v2/repository/models/{m}/load "
        "and /unload), poll (the config file re-read every --repository-poll-secs).",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="With --model-control-mode explicit: a model served at start (repeatable; '*' "
        "alone: every model).",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=float,
        default=None,
        help="With --model-control-mode poll: seconds between reads of the config (default 15).",
    )
    serve.set_defaults(handler=_serve)


def model_argument(spec: str) -> dict[str, str]:
    """`--model [NAME=]PATH` as a `[[models]]` entry; a path that is not there is refused,
    naming it."""
    name, path = "", spec
    if "=" in spec and not Path(spec).exists():  # a name never holds "=": split at the first
        name, _, path = spec.partition("=")
    model = Path(path).expanduser().resolve()
    if not model.exists():
        raise FileNotFoundError(f"--model {spec}: no such file or folder: {model}")
    return {"name": name or (model.stem if model.is_file() else model.name), "path": str(model)}


def _serve(args: argparse.Namespace) -> int:
    from ferry.server.app import create_app
    from ferry.server.layout_choice import Host, apply_layout, choose_layout
    from ferry.server.logs import configure_logging
    from ferry.server.serve import serve
    from ferry.server.settings import load_settings

    try:
        models = [model_argument(spec) for spec in args.model]
    except FileNotFoundError as exc:
        raise SystemExit(f"ferry serve: {exc}") from None
    try:
        settings = load_settings(
            args.config,
            extra_models=models,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            model_control_mode=args.model_control_mode,
            load_models=tuple(args.load_model) or None,
            repository_poll_secs=args.repository_poll_secs,
        )
    except ValueError as exc:  # pydantic's ValidationError, a bad file or variable: no traceback
        raise SystemExit(f"ferry serve: {exc}") from None
    configure_logging(settings.log_level, settings.log_format)
    chosen = choose_layout(settings, Host.this())
    settings = apply_layout(settings, chosen)
    logging.getLogger(__name__).info("ferry: %s (%s)", layout(settings), chosen.why)
    if settings.api_servers > 1 or settings.replicas > 1:
        from ferry.server.procs.supervisor import run

        return run(settings)
    serve(create_app(settings), settings)
    return 0


def layout(settings: Settings) -> str:
    """Which processes serve, and why, for the start-up log."""
    if settings.replicas > 1:
        return (
            f"{settings.replicas} replicas on one port (replicas = {settings.replicas}): whole "
            "servers, each with its own models and batchers; no process hop per request"
        )
    if settings.api_servers > 1:
        return (
            f"{settings.api_servers} API processes in front of one engine process "
            f"(api_servers = {settings.api_servers}): the models are held once"
        )
    return "one process (replicas = 1, api_servers = 1)"
