"""Structured JSON logs: one object per line, never the thinking text itself.

Records carry their fields in ``extra={...}``; the formatter writes them beside the
message. Text appears only as its length and a short hash (``text_fields``), unless
``THINKTRANS_LOG_TEXT`` asks for the text too, for debugging.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {
    "message", "asctime", "taskName", "color_message",
}
_log_text = False


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(level: str, *, log_text: bool = False) -> None:
    """Send every logger (uvicorn's too) through the JSON formatter on stderr."""
    global _log_text
    _log_text = log_text
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


def text_fields(text: str, prefix: str = "text") -> dict[str, Any]:
    """How a text appears in logs: its length and a hash; the text itself only if asked."""
    fields: dict[str, Any] = {
        f"{prefix}_len": len(text),
        f"{prefix}_sha": hashlib.blake2b(text.encode("utf-8", "replace"),
                                         digest_size=6).hexdigest(),
    }
    if _log_text:
        fields[prefix] = text
    return fields
