"""Structured JSON logs: one object per line, never the thinking text itself.

Records carry their fields in ``extra={...}``; the formatter writes them beside the
message. Text appears only as its length and a short hash (``text_fields``), unless
``THINKTRANS_LOG_TEXT`` asks for the text too, for debugging.

Other writers to stderr (Python ``warnings``, the plain-text handlers huggingface_hub and
transformers install) are brought into line, so that stderr stays one JSON object a line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
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


def configure(level: str, *, log_text: bool, transformers: bool = True) -> None:
    """Send every logger (uvicorn's, huggingface_hub's, Python warnings) through the JSON
    formatter on stderr.

    ``log_text``: the ``log_text`` setting (False until the settings are read).
    ``transformers``: take over its logger now, importing it if installed (about 0.7 s, no
    torch); pass False where nothing will load it, as it installs its own handler on import.
    """
    global _log_text
    _log_text = log_text
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        _propagate(name)
    for name in ("httpx", "httpcore"):  # a line per request to a backend: only at debug
        logging.getLogger(name).setLevel(logging.DEBUG if root.level <= logging.DEBUG
                                         else logging.WARNING)
    logging.captureWarnings(True)
    no_progress_bars()
    if _installed("huggingface_hub"):
        import huggingface_hub.utils.logging  # noqa: F401 - adds its handler, dropped below

        _propagate("huggingface_hub")
    if "transformers" in sys.modules or (transformers and _installed("transformers")):
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        _propagate("transformers")


def no_progress_bars() -> None:
    """Switch off the progress bars of huggingface_hub and transformers ("Loading weights",
    "Writing model shards", downloads): a bar is not a log line, nor a command's output.

    Through ``HF_HUB_DISABLE_PROGRESS_BARS`` too, so that what is imported later and child
    processes (a CTranslate2 conversion) start with them off; an operator's own setting of
    that variable wins.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"].strip().lower() in ("0", "false", "no", "off"):
        return
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # transformers reads this when it is imported
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def quiet(*, transformers: bool = False) -> None:
    """Keep log lines off a command's terminal; the command reports failures itself.

    With no handler configured, Python prints warnings, and a failed model load's
    traceback, to stderr, and huggingface_hub and transformers print theirs through their
    own handlers. A handler that drops the service's records stops the first, and leaves
    logging set up by an embedding program alone; the libraries keep only their errors.
    ``transformers``: it will be loaded; not yet imported, it is quieted through
    ``TRANSFORMERS_VERBOSITY`` (an operator's own setting wins), as importing it costs a
    command that fails before it loads a model a second. Progress bars are off
    (``no_progress_bars``); a command shows its own progress on a terminal.
    """
    no_progress_bars()
    for name in ("thinktrans", "models"):  # the service's and the backends' loggers
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(logging.NullHandler())
    if _installed("huggingface_hub"):
        from huggingface_hub.utils import logging as hub_logging  # adds its handler on import

        hub_logging.set_verbosity_error()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
    elif transformers:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _propagate(name: str) -> None:
    """Records of ``name`` go to the root's JSON handler only, not to a handler of its own."""
    logger = logging.getLogger(name)
    logger.handlers[:] = []
    logger.propagate = True


def _installed(name: str) -> bool:
    return name in sys.modules or importlib.util.find_spec(name) is not None


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
