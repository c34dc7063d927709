"""Structured JSON logging: one object per line, with the `extra` fields of each call.

Operators ship these lines to Loki/Elasticsearch; keys are stable (`ts`, `level`, `logger`,
`msg`, plus any structured fields), so a query like `task="bus.consume.jobs"` works.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The `extra` fields of a call."""
    return {
        k: v
        for k, v in record.__dict__.items()
        if k not in _STD and not k.startswith("_") and k != "color_message"  # uvicorn's
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """One line for people (`make up`'s logs): the message, then its `extra` fields as
    key=value, so a warning says what went wrong in text too."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _fields(record)
        if not fields:
            return text
        head, newline, rest = text.partition("\n")  # a traceback stays below the line
        pairs = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in fields.items())
        return f"{head} {pairs}{newline}{rest}"


def setup_logging(level: str = "info", json_format: bool = True) -> None:
    """Configure the root logger once for a service process."""
    handler = logging.StreamHandler(sys.stderr)
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # nats-py logs every reconnect attempt at error level; our own callbacks report them once.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
