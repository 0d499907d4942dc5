"""Structured JSON logs for operators: every record is one JSON line carrying its `extra` fields
(urn, aspect, run_id, ... where the code provides them), and `request_id` when it is written while a request is
served (app.ops.middleware sets `REQUEST_ID` for the request's whole context, its tasks included)."""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar

import orjson

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

# The id of the HTTP request being served (the X-Request-Id it answers with); None outside a request.
REQUEST_ID: ContextVar[str | None] = ContextVar("metaledger_request_id", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id is not None:
            entry["request_id"] = request_id
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str = "INFO") -> None:
    root = logging.getLogger("metaledger")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
