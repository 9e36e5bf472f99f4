"""The tests' tiny checkpoints, built once a session, and CTranslate2 conversions in the test
process.

``build`` writes the random-weight checkpoints (``service.tools.testmodel``) that the local
backend's tests share; tests/conftest.py offers them as the session fixture ``models``. They
are read only: a test that changes a checkpoint works on its own copy. Under pytest-xdist,
``build_shared`` builds them once for all the workers.

``InProcessConversions`` stands in for ``subprocess`` in ``models.local.convert``: the child
command the backend runs to convert a checkpoint (``models.local.convert.main``) is run in this
process instead, which saves each conversion a fresh start of torch, transformers and
CTranslate2; every other command runs as a real process. conftest puts it in place for every
test but those marked ``child_conversion``, which see the real child process
(tests/test_ct2.py has one that only a child process passes).
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from models.local import convert

# Conversions the backends of one test start at once run one after another, as the converter
# was never meant to share a process.
_CONVERTING = threading.Lock()


# Each shared checkpoint: its name, its family, the directory under the root, its target.
_CHECKPOINTS = (("nllb", "nllb", "nllb", "de"), ("m2m100", "m2m100", "m2m100", "de"),
                ("marian", "marian", "marian-en-de", "de"),
                ("marian-en-ja", "marian", "marian-en-ja", "ja"))


def build(root: Path) -> dict[str, Path]:
    """The shared checkpoints under ``root``: one per family (Marian: en-de), and a Marian
    en-ja."""
    from service.tools.testmodel import make_test_model

    return {name: make_test_model(family, root / folder, target_lang=target)
            for name, family, folder, target in _CHECKPOINTS}


def build_shared(root: Path) -> dict[str, Path]:
    """``build`` under ``root``, once for every process that asks (pytest-xdist's workers):
    the first builds them under a lock and marks them done; the others wait, then read."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    done = root / "built"
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not done.exists():
            build(root)
            done.touch()
    return {name: root / folder for name, _, folder, _ in _CHECKPOINTS}


class InProcessConversions:
    """``subprocess`` as ``models.local.convert`` uses it, with its conversion child run in
    this process: the same exit code, and the same last line of stderr on failure."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def run(self, command: list[str], **kwargs: Any) -> Any:
        if command[:3] != [sys.executable, "-c", convert._CHILD]:
            return subprocess.run(command, **kwargs)
        stderr = io.StringIO()
        with _CONVERTING, contextlib.redirect_stderr(stderr):
            try:
                code = convert.main(command[3:])
            except SystemExit as exc:  # argparse's refusal of the command line
                code = exc.code if isinstance(exc.code, int) else 1
            except Exception as exc:  # a child would die with its traceback's last line
                print(f"{type(exc).__name__}: {exc}", file=stderr)
                code = 1
        return subprocess.CompletedProcess(command, code, "", stderr.getvalue())
