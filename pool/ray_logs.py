"""The pool's processes log as the service does, in JSON lines on stderr: the launcher's and
every replica's own records, and Ray's, go to the root's JSON handler, not to the handlers
and files Ray and Serve set up for themselves.
"""

from __future__ import annotations

import logging
import sys

from service.ops.logs import configure as configure_logs


def propagate(name: str) -> None:
    """Records of ``name`` go to the root's JSON handler only, not to a handler of its own."""
    logger = logging.getLogger(name)
    logger.handlers[:] = []
    logger.propagate = True


def replica_logs(level: str) -> None:
    """A replica's own logs as the service's JSON lines, on the process's stderr, which Ray
    brings to the pool's terminal: Serve, keeping its own logs off stderr, puts a writer to
    its log file in ``sys.stderr``. A replica's records never hold text (``log_text`` is the
    sidecars')."""
    configure_logs(level, log_text=False)
    propagate("ray")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and sys.__stderr__ is not None:
            handler.setStream(sys.__stderr__)
