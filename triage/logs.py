"""Logging for the job log: one line per event, as text or as JSON, secrets redacted."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from triage import redact
from triage.redact import Redactor, printable

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _Redact(logging.Filter):
    """Masks secrets in the message, the traceback and string extras of every record."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redactor(record.getMessage()), None
        if record.exc_info:
            record.exc_text = self.redactor(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, self.redactor(value))
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["error"] = record.exc_text
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # one line per record, nothing a terminal would act on (JSON lines escape these themselves)
        return f"{stamp} {record.levelname.lower():7} {printable(record.getMessage())}"


#: the format `configure` set last; the CLI reports a fatal error as a log line when it is "json"
current_format = "text"


def configure(fmt: str = "text", secrets: Sequence[str] = (), level: int = logging.INFO) -> None:
    """Send triage's log lines to stderr (stdout is the report's)."""
    global current_format
    current_format = fmt
    logger = logging.getLogger("triage")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    redact.configure(secrets)
    handler.addFilter(_Redact(redact.Redactor(secrets)))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
