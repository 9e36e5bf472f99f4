from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from models.base import Translator
from service.app import create_app
from service.settings import Settings, load_settings
from tests.fakes_remote import FakeChat, FakeDeepL


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings read THINKTRANS_* variables; a test sees only the ones it sets."""
    for name in list(os.environ):
        if name.startswith("THINKTRANS_") or name == "DEEPL_AUTH_KEY":
            monkeypatch.delenv(name)
    yield


def make_settings(**overrides: Any) -> Settings:
    overrides.setdefault("backend", "passthrough")
    return load_settings(**overrides)


class Running:
    """An app with its lifespan running and an in-process HTTP client."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client

    @property
    def pipeline(self) -> Any:
        return self.app.state.pipeline

    async def metric(self, name: str, **labels: str) -> float:
        value = self.app.state.metrics.registry.get_sample_value(name, labels or None)
        return float(value or 0.0)


async def start_app(
    settings: Settings, backends: dict[str, Translator] | None = None
) -> AsyncIterator[Running]:
    app = create_app(settings, backends=backends)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield Running(app, client)


@pytest.fixture(scope="module")
def deepl_server() -> Iterator[FakeDeepL]:
    """A DeepL v2 API double on 127.0.0.1, one per test module; tests set its mode."""
    server = FakeDeepL()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def chat_server() -> Iterator[FakeChat]:
    """An OpenAI-compatible chat double on 127.0.0.1, one per test module."""
    server = FakeChat()
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def passthrough_app() -> AsyncIterator[Running]:
    async for running in start_app(make_settings(default_locale="zh-CN")):
        yield running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """`thinktrans serve` in its own process; its log goes to a file, not a pipe that fills."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def terminate(self, timeout_s: float) -> float:
        """SIGTERM; the seconds until the process is gone."""
        import signal

        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"no exit within {timeout_s} s of SIGTERM") from None
        return time.monotonic() - started


@contextmanager
def served(**env: str) -> Iterator[Server]:
    """Start `python -m service.cli serve` on a free port of 127.0.0.1 (passthrough unless
    ``env`` says otherwise), wait for /readyz, and stop it afterwards."""
    port = free_port()
    full_env = {**os.environ, "THINKTRANS_BACKEND": "passthrough", **env}
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "serve.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                env=full_env, stdout=log, stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parent.parent,
            )
        server = Server(proc, f"http://127.0.0.1:{port}", log_path)
        try:
            give_up = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    raise AssertionError(f"serve exited: {server.log()[-2000:]}")
                if time.monotonic() > give_up:
                    raise AssertionError(f"serve not ready: {server.log()[-2000:]}")
                time.sleep(0.1)
            yield server
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


class InThread:
    """The app under uvicorn on a free port of 127.0.0.1, in a thread with its own loop:
    real connections (SSE that a reader can drop), tests keep their own loop."""

    def __init__(self, backends: dict[str, Translator] | None = None, **overrides: Any) -> None:
        import threading

        import uvicorn

        from models.passthrough import PassthroughTranslator

        if backends is None:
            backends = {"passthrough": PassthroughTranslator()}
        app = create_app(make_settings(**overrides), backends=backends)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, loop="asyncio", lifespan="on", log_level="warning",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        give_up = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < give_up and self._thread.is_alive(), "did not start"
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
