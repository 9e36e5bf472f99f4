"""Operations: graceful shutdown, JSON logs without thinking text, liveness vs readiness."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from models.passthrough import PassthroughTranslator
from service.ops.metrics import Metrics
from service.ops.status import StatusReport
from tests.conftest import free_port, make_settings, served, start_app
from tests.fakes import FakeTranslator

SECRET = "The secret plan is to add seven and nine"


def test_shutdown_flushes_open_streams_and_logs_no_text() -> None:
    # At debug, where chunk POSTs and batches are logged too: still no text.
    with served(THINKTRANS_DEFAULT_LOCALE="zh-CN", THINKTRANS_FLUSH_IDLE_MS="60000",
                THINKTRANS_LOG_LEVEL="debug") as srv:
        url, proc = srv.url, srv.proc
        assert httpx.post(f"{url}/v1/streams", json={"stream_id": "d1"}).status_code == 201
        text = f"First sentence here. {SECRET}"  # the second part has no sentence end
        r = httpx.post(f"{url}/v1/streams/d1/chunks",
                       json={"chunks": [{"seq": 0, "text": text}]})
        assert r.json() == {"accepted_through": 0}
        lines: list[str] = []

        def read() -> None:
            with httpx.stream("GET", f"{url}/v1/streams/d1/events", timeout=30,
                              headers={"Accept": "text/event-stream"}) as resp:
                lines.extend(line for line in resp.iter_lines() if line.startswith("data: "))

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.5)  # the first segment is out; the rest waits for idle or close
        proc.send_signal(signal.SIGTERM)
        reader.join(20)
        proc.wait(20)
        log = srv.log()
    events = [json.loads(line[6:]) for line in lines]
    assert [e.get("original") for e in events[:-1]] == ["First sentence here. ", SECRET]
    assert events[-1] == {"segments": 2}  # `end` after the flushed segment
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(r["msg"] == "request" and r["route"] == "/v1/streams/{stream_id}/chunks"
               for r in records)
    assert any(r["msg"] == "batch" and r["backend"] == "passthrough" and r["text_len"]
               for r in records)
    assert any(r["msg"] == "streams drained" for r in records)
    assert "secret plan" not in log


def test_info_logs_a_line_per_request_but_successful_chunk_posts() -> None:
    with served() as srv:
        r = httpx.post(f"{srv.url}/v1/streams/q1/chunks",
                       json={"chunks": [{"seq": 0, "text": "Quiet. "}]})
        assert r.status_code == 200
        r = httpx.post(f"{srv.url}/v1/streams/q1/chunks",
                       json={"chunks": [{"seq": 0, "text": "Other text."}]})
        assert r.status_code == 409
        assert httpx.get(f"{srv.url}/v1/limits").status_code == 200
        give_up = time.monotonic() + 5
        while '"/v1/limits"' not in (log := srv.log()) and time.monotonic() < give_up:
            time.sleep(0.05)  # the access line is written after the answer is sent
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    chunk_lines = [r["status"] for r in records if r.get("msg") == "request"
                   and r["route"] == "/v1/streams/{stream_id}/chunks"]
    assert chunk_lines == [409]  # the failure only
    assert any(r.get("route") == "/v1/limits" for r in records)


def test_log_text_puts_the_text_in_debug_batch_lines_only_when_asked() -> None:
    with served(THINKTRANS_DEFAULT_LOCALE="zh-CN", THINKTRANS_LOG_LEVEL="debug",
                THINKTRANS_LOG_TEXT="true") as srv:
        r = httpx.post(f"{srv.url}/v1/translate",
                       json={"texts": [SECRET + "."], "target": "zh-CN"})
        assert r.status_code == 200
        log = srv.log()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(r.get("msg") == "batch" and r.get("text") == SECRET + "." for r in records)


def test_new_streams_are_refused_while_draining() -> None:
    async def scenario() -> None:
        async for running in start_app(make_settings(shutdown_grace_s=0.2)):
            await running.app.state.runtime.streams.drain(0.2)
            r = await running.client.post("/v1/streams", json={"stream_id": "late"})
            assert r.status_code == 503
            assert r.headers["Retry-After"]
            assert r.headers["content-type"] == "application/problem+json"

    import asyncio

    asyncio.run(scenario())


async def test_liveness_is_not_readiness() -> None:
    loading = FakeTranslator(name_="fake")
    loading.ready, loading.reason = False, "loading model 'x'"
    backends = {"fake": loading, "passthrough": PassthroughTranslator()}
    async for running in start_app(make_settings(backend="fake"), backends):
        assert (await running.client.get("/healthz")).status_code == 200
        ready = await running.client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["backends"]["fake"]["reason"] == "loading model 'x'"
        loading.ready, loading.reason = True, None
        assert (await running.client.get("/readyz")).status_code == 200


async def test_a_chain_with_one_backend_down_is_degraded_but_ready() -> None:
    down = FakeTranslator(name_="fake")
    down.ready, down.reason = False, "quota exceeded"
    backends = {"fake": down, "passthrough": PassthroughTranslator()}
    async for running in start_app(make_settings(backend="fake,passthrough"), backends):
        ready = await running.client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "degraded"
        assert ready.json()["backends"]["fake"]["reason"] == "quota exceeded"
        metrics = (await running.client.get("/metrics")).text
        assert 'thinktrans_backend_ready{backend="fake"} 0.0' in metrics


def test_the_status_report_judges_readiness_from_the_parts_it_is_given() -> None:
    # No runtime: the report reads only the backends, settings and metrics handed to it.
    first, second = FakeTranslator(name_="first"), FakeTranslator(name_="second")
    metrics = Metrics()
    status = StatusReport(make_settings(backend="first,second"),
                          {"first": first, "second": second}, {}, None, metrics)
    assert status.readiness() == {"status": "ready", "backends": {
        "first": {"ready": True, "reason": None}, "second": {"ready": True, "reason": None}}}
    first.ready, first.reason = False, "quota exceeded"
    degraded = status.readiness()
    assert degraded["status"] == "degraded" and "falls through to second" in degraded["reason"]
    second.ready, second.reason = False, "loading model 'x'"
    assert status.readiness()["status"] == "not_ready"
    assert b'thinktrans_backend_ready{backend="second"} 0.0' in metrics.render()


def _healthcheck_command() -> list[str]:
    """The Dockerfile's HEALTHCHECK command, as the container runtime would run it."""
    dockerfile = (Path(__file__).resolve().parent.parent / "Dockerfile").read_text()
    match = re.search(r"^HEALTHCHECK [^\n]*\\\n\s*CMD (\[.*\])$", dockerfile, re.M)
    assert match, "no HEALTHCHECK ... CMD [...] in the Dockerfile"
    command = json.loads(match.group(1))
    return [sys.executable if part == "python3" else part for part in command]


def test_the_image_healthcheck_follows_serve_port(tmp_path: Path) -> None:
    # `serve --port P` (as served() starts it) with THINKTRANS_PORT naming another port: the
    # check asks where the server really listens, not THINKTRANS_PORT.
    other = str(free_port())
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path), "THINKTRANS_PORT": other,
           "PYTHONPATH": os.pathsep.join(sys.path)}
    root = Path(__file__).resolve().parent.parent

    def run_check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(_healthcheck_command(), env=env, cwd=root, capture_output=True,
                              text=True, timeout=60)

    with served(XDG_RUNTIME_DIR=str(tmp_path), THINKTRANS_PORT=other) as srv:
        state = json.loads((tmp_path / "thinktrans" / "serve.json").read_text())
        assert state["url"] == srv.url
        done = run_check()
        assert done.returncode == 0, done.stderr
        assert f"{srv.url}/healthz: 200" in done.stdout
        cli = subprocess.run([sys.executable, "-m", "service.cli", "health"], env=env,
                             cwd=root, capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        srv.terminate(60)
    assert not (tmp_path / "thinktrans" / "serve.json").exists()  # removed at the stop
    done = run_check()  # nothing listens on THINKTRANS_PORT: unhealthy, in one line
    assert done.returncode == 1
    assert f"127.0.0.1:{other}/healthz" in done.stderr


def test_the_image_build_carries_every_package_the_project_installs() -> None:
    """The build context (.dockerignore) and the Dockerfile's COPY lines hold every top-level
    package pyproject installs: a package left out fails the build at its COPY."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parent.parent
    include = tomllib.loads((root / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(p.name for p in root.iterdir()
                      if (p / "__init__.py").is_file()
                      and any(fnmatch.fnmatch(p.name, pattern) for pattern in include))
    assert packages, include
    rules = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "the context starts from nothing and lets in what the image needs"
    dockerfile = (root / "Dockerfile").read_text()
    for name in packages:
        assert f"!{name}/" in rules, f"{name}/ is kept out of the build context"
        assert re.search(rf"^COPY {name} \./{name}$", dockerfile, re.M), \
            f"the Dockerfile copies no {name}/"
        assert re.search(rf"mkdir [^&]*\b{name}\b", dockerfile), \
            f"the dependency layer makes no stub of {name}/"


def test_health_asks_readyz_and_waits_a_bounded_time(tmp_path: Path) -> None:
    # `--ready` asks /readyz where the server listens; `--wait S` asks again until a 200, S
    # seconds at most, then says in one line what it last asked (the README's blocks wait so
    # for the server they start; tests/test_readme.py runs them).
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(sys.path)}

    def health(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service.cli", "health", *args], env=env,
                              cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                              text=True, timeout=120)

    with served(XDG_RUNTIME_DIR=str(tmp_path)) as srv:
        done = health("--ready", "--wait", "30")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{srv.url}/readyz: 200"
        srv.terminate(60)
    done = health("--url", srv.url, "--wait", "1")  # nothing listens there now
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"{srv.url}/healthz: ")
