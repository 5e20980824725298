"""How every Ferry process writes its log: one handler on the root logger, in the configured
`log_format` ("text" or "json", one object a line), each record stamped with the id of the
request being handled (server/request_ids.py) when there is one. uvicorn's loggers (its access
log too) write through the same handler, so their lines have the same shape and the same id."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Literal

from ferry.server import request_ids

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s:%(request_tag)s %(message)s"
# uvicorn's own loggers: given no handler of their own, they reach the root's.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (None outside a request) and `request_tag` (" [id]" or "") to records."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = request_ids.current.get()
        record.request_id = request_id
        record.request_tag = f" [{request_id}]" if request_id else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, request_id when
    set, and exc_info (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            line["request_id"] = request_id
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def make_handler(log_format: LogFormat) -> logging.Handler:
    handler = logging.StreamHandler()  # stderr
    handler.addFilter(RequestIdFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT, defaults={"request_tag": ""}))
    return handler


def configure_logging(log_level: str, log_format: LogFormat) -> None:
    """The process's logging, once at its start (the CLI, and each process it spawns)."""
    logging.basicConfig(level=log_level.upper(), handlers=[make_handler(log_format)], force=True)
    for name in UVICORN_LOGGERS:
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True


__all__ = ["JsonFormatter", "LogFormat", "RequestIdFilter", "configure_logging", "make_handler"]
