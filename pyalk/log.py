"""Logging for pyalk's own processes (the CLI worker): the library itself only
logs through the standard library (``logging.getLogger("pyalk.worker")`` and
friends) and never configures handlers or prints.

Records carry structured fields as attributes (``extra=``): ``queue``,
``worker_id``, ``job_id``, ``attempt``, ``duration_s``, ``error`` and so on.
:func:`fields` collects them; the two formatters here render them as
``key=value`` pairs or as one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any

#: The attributes every LogRecord has; anything else came from ``extra=``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a record was logged with (``extra=``)."""
    return {key: value for key, value in record.__dict__.items() if key not in _STANDARD}


class KeyValueFormatter(logging.Formatter):
    """``2024-05-01T12:00:00 INFO pyalk.worker: job 7 done in 0.002s  queue=q job_id=7 ...``"""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname} {record.name}: {record.getMessage()}"
        extra = " ".join(f"{key}={_short(value)}" for key, value in fields(record).items())
        if extra:
            line += "  " + extra
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the
    structured fields, and the traceback as ``exc`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **fields(record),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def _short(value: Any) -> str:
    """A field value for ``key=value``: quoted (JSON) when it has spaces, ``"`` or ``=``."""
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        text = json.dumps(text)
    return text


def configure(level: str | int = "INFO", fmt: str = "text", stream: IO[str] | None = None,
              handler: logging.Handler | None = None) -> logging.Handler:
    """Send the ``pyalk`` loggers to ``stream`` (stderr) or ``handler``, in
    ``fmt`` ``text`` (key=value) or ``json``. Returns the handler installed;
    calling it again replaces it. For applications and the CLI: the library
    never calls this itself."""
    logger = logging.getLogger("pyalk")
    for existing in list(logger.handlers):
        if getattr(existing, "_pyalk_configured", False):
            logger.removeHandler(existing)
    if handler is None:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    handler._pyalk_configured = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level.upper() if isinstance(level, str) else level)
    logger.propagate = False
    return handler
