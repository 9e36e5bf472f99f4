"""DeepL's own API mock server (``tests/deepl-mock/``, MIT, by DeepL) for the DeepL tests.

Installed once per version of its files (a cache directory named by their hash, where
``npm ci --omit=dev`` runs under a lock), served by ``node index.js`` on a free port of
127.0.0.1. Its translations are fixed phrases, not translations: tests against it check
shapes and statuses. A session (request headers) sets what it does: 429s, 5xx, a character
limit for a new account. Without Node.js and npm the tests that need it skip, saying so.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

SOURCE = Path(__file__).resolve().parent / "deepl-mock"
NO_NODE = ("DeepL's mock server needs Node.js and npm (tests/run.sh installs Debian's nodejs "
           "and npm where apt-get can)")


def _digest() -> str:
    """The hash of the vendored files, which names their installed copy."""
    digest = hashlib.sha256()
    for path in sorted(p for p in SOURCE.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def install() -> Path:
    """The mock's directory with its dependencies, made once per version of its files."""
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        pytest.skip(NO_NODE)
    root = Path(tempfile.gettempdir()) / f"thinktrans-deepl-mock-{_digest()}"
    root.mkdir(exist_ok=True)
    app = root / "app"
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers install it once between them
        if not (root / "installed").exists():
            shutil.rmtree(app, ignore_errors=True)
            shutil.copytree(SOURCE, app, ignore=shutil.ignore_patterns("node_modules"))
            done = subprocess.run([npm, "ci", "--omit=dev", "--no-audit", "--no-fund"],
                                  cwd=app, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise AssertionError(f"npm ci --omit=dev failed in {app}:\n"
                                     f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            (root / "installed").touch()
    return app


@dataclass
class DeepLMock:
    """A running mock: its URL, and fresh sessions and accounts for a test."""

    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    @staticmethod
    def new_key() -> str:
        """An API key no request has used: the mock opens a new account for it."""
        return f"thinktrans-{uuid.uuid4().hex}"

    @staticmethod
    def session(**settings: int) -> dict[str, str]:
        """The headers of a new session, e.g. ``session(**{"429-count": 2})``; an account
        the session opens takes its ``init-character-limit``."""
        headers = {"mock-server-session": uuid.uuid4().hex}
        headers.update({f"mock-server-session-{name}": str(value)
                        for name, value in settings.items()})
        return headers

    def post(self, path: str, key: str, headers: dict[str, str], **data: Any) -> httpx.Response:
        """A request of the test's own, as the account ``key`` in the session ``headers``."""
        return httpx.post(f"{self.url}{path}", json=data, timeout=30, headers={
            "Authorization": f"DeepL-Auth-Key {key}", "User-Agent": "thinktrans-tests",
            **headers})


@contextmanager
def served_mock(ready_s: float = 120.0) -> Iterator[DeepLMock]:
    """``node index.js`` on a free port of 127.0.0.1 until the block ends."""
    app = install()
    node = shutil.which("node")
    assert node is not None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPL_MOCK_")}
    env["DEEPL_MOCK_SERVER_PORT"] = str(port)
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "deepl-mock.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen([node, "index.js"], cwd=app, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        mock = DeepLMock(f"http://127.0.0.1:{port}", log_path)
        try:
            give_up = time.monotonic() + ready_s  # only a hang guard: a loaded machine is slow
            while True:
                try:
                    if httpx.get(f"{mock.url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > give_up:
                    raise AssertionError(f"DeepL's mock server did not start:\n{mock.log()}")
                time.sleep(0.1)
            yield mock
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
