"""Shared test helpers: settings, the app in-process, served processes, stream helpers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from models.base import Translator
from service.http.app import create_app
from service.runtime import Runtime
from service.settings import Settings, load_settings
from tests import checkpoints
from tests.deepl_mock import DeepLMock, served_mock
from tests.fakes_deepl import MarkupDeepL
from tests.fakes_remote import FakeChat, FakeDeepL

# Tests load tiny checkpoints in-process: no "Loading weights" bars in the test output (the
# service's own commands switch them off through service.ops.logs.no_progress_bars).
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@pytest.fixture
def hub_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No model hub: huggingface_hub reads HF_HUB_OFFLINE once, at import, so its constant is
    set too."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "child_conversion: CTranslate2 conversions run in a "
                            "child process, as the backend runs them (tests/checkpoints.py)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (tests/run.sh), a module goes whole to one worker, so a module's
    server starts once; the modules that start a Ray instance go to the same worker, one
    after the other, as two at once would only fight for the cores. Modules go out in the
    order collected (``pytest_collection_modifyitems``: the longest first)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "ray" if module in RAY_MODULES else module

    config.option.loadscopereorder = False
    return ByModule(config, log)


RAY_MODULES = {"tests/test_pool.py", "tests/test_pool_fair.py"}
# The modules that take longest, longest first: started first, they do not finish last.
LONGEST = ("test_pool.py", "test_pool_fair.py", "test_ct2.py", "test_cli.py",
           "test_config_errors.py", "test_detect.py", "test_faults.py", "test_client.py",
           "test_local_models.py", "test_local.py", "test_viewer_browser.py",
           "test_acp_proxy.py", "test_acp_exits.py", "test_ops.py", "test_fuzz.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first (``LONGEST``), each module's tests in their order."""
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST)))


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The session's tiny checkpoints (tests/checkpoints.py), built once; read only. Under
    pytest-xdist the workers share one build (``checkpoints.build_shared``)."""
    for module in ("torch", "transformers", "sentencepiece"):
        pytest.importorskip(module, reason="needs the local extra: pip install 'thinktrans[local]'")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Each worker's base temp lies in the run's own: the workers meet there.
        return checkpoints.build_shared(tmp_path_factory.getbasetemp().parent / "models")
    return checkpoints.build(tmp_path_factory.mktemp("models"))


@pytest.fixture(autouse=True)
def _conversions_in_process(request: pytest.FixtureRequest,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """CTranslate2 conversions run in the test process (tests/checkpoints.py), unless the
    test is marked ``child_conversion``."""
    if request.node.get_closest_marker("child_conversion") is None:
        monkeypatch.setattr(checkpoints.convert, "subprocess", checkpoints.InProcessConversions())


@pytest.fixture(scope="session")
def _ct2_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ct2-cache")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, _ct2_cache: Path) -> Iterator[None]:
    """Settings read THINKTRANS_* variables; a test sees only the ones it sets. Checkpoints
    the CTranslate2 engine converts go to a cache of the session, never the user's."""
    for name in list(os.environ):
        if name.startswith("THINKTRANS_") or name == "DEEPL_AUTH_KEY":
            monkeypatch.delenv(name)
    monkeypatch.setenv("THINKTRANS_LOCAL_CT2_CACHE", str(_ct2_cache))
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
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    async def metric(self, name: str, **labels: str) -> float:
        value = self.app.state.metrics.registry.get_sample_value(name, labels or None)
        return float(value or 0.0)


async def start_app(
    settings: Settings, backends: dict[str, Translator] | None = None
) -> AsyncIterator[Running]:
    app = create_app(settings, backends=backends)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield Running(app, client)


@asynccontextmanager
async def app_with(
    translator: Translator | None = None, *, backends: dict[str, Translator] | None = None,
    **overrides: Any,
) -> AsyncIterator[Running]:
    """An app with its lifespan running (passthrough unless ``overrides`` say otherwise).

    With ``translator``, that backend (beside passthrough) is the chain; ``backends``
    replaces the built ones. A translator's gate is opened before shutdown, which
    otherwise waits for running batches.
    """
    if translator is not None:
        from models.passthrough import PassthroughTranslator

        backends = {"passthrough": PassthroughTranslator(), translator.name: translator}
        overrides.setdefault("backend", translator.name)
    gen = start_app(make_settings(**overrides), backends)
    running = await anext(gen)
    try:
        yield running
    finally:
        gate = getattr(translator, "gate", None)
        if gate is not None:
            gate.set()
        await gen.aclose()


# -- streams over HTTP ---------------------------------------------------------------------

PROBLEM = "application/problem+json"


async def post_chunks(client: httpx.AsyncClient, sid: str, chunks: list[tuple[int, str]]
                      ) -> httpx.Response:
    body = {"chunks": [{"seq": seq, "text": text} for seq, text in chunks]}
    return await client.post(f"/v1/streams/{sid}/chunks", json=body)


def deltas(text: str, size: int = 7) -> list[tuple[int, str]]:
    """``text`` as (seq, chunk) pairs of ``size`` characters."""
    return list(enumerate(text[i:i + size] for i in range(0, len(text), size)))


async def poll(client: httpx.AsyncClient, sid: str, after: int = -1, wait_ms: int = 0
               ) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/streams/{sid}/events", params={"after": after, "wait_ms": wait_ms})
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = r.json()["events"]
    return events


async def read_until(client: httpx.AsyncClient, sid: str, stop: str = "end", *,
                     after: int = -1, count: int = 1, timeout_s: float = 60.0
                     ) -> list[dict[str, Any]]:
    """Long-poll from ``after`` until ``count`` events of type ``stop`` are in."""
    events: list[dict[str, Any]] = []
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        got = await poll(client, sid, after, wait_ms=500)
        events += got
        if got:
            after = got[-1]["id"]
        if sum(e["type"] == stop for e in events) >= count:
            return events
    raise AssertionError(f"no {count} {stop!r} event(s) within {timeout_s} s: {events}")


def segments(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "segment"]


def check_stream(events: list[dict[str, Any]], text: str) -> None:
    """The contract's invariant over every event of one ended stream."""
    assert [e["id"] for e in events] == list(range(len(events))), "event ids rise from 0"
    types = [e["type"] for e in events]
    assert types.count("end") == 1 and types[-1] == "end", types
    segs = segments(events)
    assert [s["index"] for s in segs] == list(range(len(segs))), "segments out in index order"
    assert all(s["original"] for s in segs), "no empty segment"
    assert "".join(s["original"] for s in segs) == text, "the originals join back exactly"
    assert events[-1]["data"] == {"segments": len(segs)}
    for s in segs:
        if s["status"] in ("deadline", "error", "same_language", "skipped", "no_target"):
            assert s["text"] == s["original"], s
        if s["status"] == "hidden":
            assert s["text"] == "" and s["backend"] is None, s
    # Each `deadline` segment gets exactly one update, after it; nothing else gets one.
    late: set[int] = set()
    for event in events:
        if event["type"] == "segment" and event["data"]["status"] == "deadline":
            late.add(event["data"]["index"])
        elif event["type"] == "update":
            index = event["data"]["index"]
            assert index in late, f"update for {index}, which was not late: {events}"
            late.discard(index)
    assert not late, f"late segments {late} got no update"


def parse_sse(body: str) -> list[dict[str, Any]]:
    """Events of a whole SSE body (fields split on LF, as the service writes them)."""
    out = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            fields[name] = fields[name] + "\n" + value if name in fields else value
        if "data" in fields:
            out.append({"id": int(fields["id"]), "type": fields.get("event", "message"),
                        "data": json.loads(fields["data"])})
    return out


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Events of a live SSE response, one at a time."""
    block: list[str] = []
    async for line in response.aiter_lines():
        if line:
            block.append(line)
            continue
        events = parse_sse("\n".join(block))
        block = []
        for event in events:
            yield event


def assert_problem(resp: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    """An RFC 9457 problem with ``status`` whose detail names each of ``words``."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = resp.json()
    assert body["status"] == status
    assert body["title"] and body["type"] and body["detail"]
    for word in words:
        assert word in body["detail"], body["detail"]
    return body


@pytest.fixture(scope="module")
def deepl_server() -> Iterator[FakeDeepL]:
    """A DeepL v2 API double on 127.0.0.1, one per test module; tests set its mode."""
    server = FakeDeepL()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def markup_deepl() -> Iterator[MarkupDeepL]:
    """A DeepL double that honours tag handling and glossaries (tests/fakes_deepl.py)."""
    server = MarkupDeepL()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def deepl_mock() -> Iterator[DeepLMock]:
    """DeepL's own API mock server (tests/deepl_mock.py), one per test module; skips where
    Node.js and npm cannot be had."""
    with served_mock() as mock:
        yield mock


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

    def terminate(self, timeout_s: float) -> None:
        """SIGTERM; AssertionError when the process is not gone within ``timeout_s``."""
        import signal

        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"no exit within {timeout_s} s of SIGTERM") from None


@contextmanager
def served(command: str = "serve", ready_s: float = 180.0, **env: str) -> Iterator[Server]:
    """Start `python -m service.cli serve` (or ``command``: `pool`) on a free port of
    127.0.0.1 (passthrough unless ``env`` says otherwise), wait up to ``ready_s`` for
    /readyz (a bound that only stops a hang: a loaded machine starts slowly), and stop it
    afterwards. The address file `thinktrans health` reads goes to the process's own
    directory unless ``env`` names XDG_RUNTIME_DIR: no two servers share one."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        full_env = {**os.environ, "THINKTRANS_BACKEND": "passthrough",
                    "XDG_RUNTIME_DIR": tmp, **env}
        log_path = Path(tmp) / f"{command}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service.cli", command, "--port", str(port)],
                env=full_env, stdout=log, stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parent.parent,
            )
        server = Server(proc, f"http://127.0.0.1:{port}", log_path)
        try:
            give_up = time.monotonic() + ready_s
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
        give_up = time.monotonic() + 60
        while not self._server.started:
            assert time.monotonic() < give_up and self._thread.is_alive(), "did not start"
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)
        self._sock.close()
