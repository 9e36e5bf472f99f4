"""Readiness that means it: the default target, and a model that failed to load.

- A chain whose ready backends cannot translate into ``THINKTRANS_DEFAULT_LOCALE`` is
  ``degraded``, with the reason, and the start log warns (a model is judged once loaded).
- A model that failed to load is tried again with backoff, and ``/readyz`` turns ready once
  the checkpoint appears, without a restart; ``wait_ready`` still fails fast, and ``aclose``
  stops the retries.

Real tiny checkpoints (``service.tools.testmodel``), the app in-process; the hub is off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the local extra: pip install 'thinktrans[local]'")
pytest.importorskip("transformers", reason="needs the local extra: pip install 'thinktrans[local]'")

from models.local import LocalTranslator
from models.passthrough import PassthroughTranslator
from service.tools.testmodel import make_test_model
from tests.configs import local_config
from tests.conftest import Running, app_with
from tests.test_local import (  # noqa: F401 - autouse fixtures and the parametrize hook
    _offline,
    engine,
    make_backend,
    pytest_generate_tests,
)

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


@pytest.fixture(scope="module")
def marian(models: dict[str, Path]) -> Path:
    """An en-de Marian checkpoint (the session's): it translates into German only."""
    return models["marian"]


def with_passthrough(local: LocalTranslator) -> dict[str, Any]:
    return {"local": local, "passthrough": PassthroughTranslator()}


async def until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``check`` (a coroutine function) until it answers something truthy."""
    give_up = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < give_up, f"{what} not within {timeout_s} s"
        await asyncio.sleep(0.05)


async def readyz(app: Running) -> tuple[int, dict[str, Any]]:
    r = await app.client.get("/readyz")
    return r.status_code, r.json()


# -- the default target ---------------------------------------------------------------------


async def test_a_model_without_the_default_target_is_degraded_with_the_reason_and_a_warning(
    marian: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="thinktrans.runtime")
    local = make_backend(marian)
    gate = threading.Event()
    local._executor.submit(gate.wait, 30)  # hold the load: not judged before it is loaded
    async with app_with(backends=with_passthrough(local), backend="local",
                        default_locale="zh-CN") as app:
        status, body = await readyz(app)
        assert status == 503 and body["status"] == "not_ready", body
        assert "loading model" in body["backends"]["local"]["reason"]
        assert "zh-CN" not in str(body)
        gate.set()
        assert await local.wait_ready(60), local.reason

        status, body = await readyz(app)
        assert status == 200, body
        assert body["status"] == "degraded"
        assert body["backends"]["local"]["ready"] is True
        reason = body["backends"]["local"]["reason"]
        assert "default target zh-CN" in reason and "it serves de" in reason, reason
        assert "THINKTRANS_DEFAULT_LOCALE" in body["reason"], body
        # The backend itself is up: its gauge stays 1.
        assert await app.metric("thinktrans_backend_ready", backend="local") == 1.0
        listed = {b["name"]: b for b in (await app.client.get("/v1/backends")).json()["backends"]}
        assert listed["local"]["serves_default_target"] is False
        assert "default target zh-CN" in listed["local"]["reason"]
        # What readiness warns of: segments for the default target fail...
        r = await app.client.post("/v1/translate", json={"texts": ["The user said hello."]})
        [seg] = r.json()["results"][0]["segments"]
        assert seg["status"] == "error", seg
        # ...while the targets the model has still work.
        r = await app.client.post("/v1/translate",
                                  json={"texts": ["The user said hello."], "target": "de"})
        [seg] = r.json()["results"][0]["segments"]
        assert (seg["status"], seg["backend"]) == ("translated", "local"), seg

        async def warned() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name == "thinktrans.runtime" and r.levelno == logging.WARNING]

        [line] = await until(warned, 10, "the start-up warning")
        assert "'local'" in line and "zh-CN" in line and "it serves de" in line, line
        assert "\n" not in line


@pytest.mark.parametrize(
    ("chain", "default", "status", "needle"),
    [
        # Another backend of the chain serves the default target: the chain falls through.
        ("local,passthrough", "zh-CN", "degraded", "falls through to passthrough"),
        # The model has the default target: nothing to say.
        ("local", "de", "ready", None),
        ("local,passthrough", "de-AT", "ready", None),
    ],
)
async def test_readiness_judges_the_default_target_of_each_loaded_backend(
    marian: Path, chain: str, default: str, status: str, needle: str | None,
) -> None:
    local = make_backend(marian)
    async with app_with(backends=with_passthrough(local), backend=chain,
                        default_locale=default) as app:
        assert await local.wait_ready(60), local.reason
        code, body = await readyz(app)
    assert (code, body["status"]) == (200, status), body
    if needle is None:
        assert body["backends"]["local"] == {"ready": True, "reason": None}
        assert "reason" not in body
    else:
        assert needle in body["reason"], body
        assert "default target" in body["backends"]["local"]["reason"]


async def test_no_default_target_judges_nothing(marian: Path) -> None:
    local = make_backend(marian)
    async with app_with(backends=with_passthrough(local), backend="local") as app:
        assert await local.wait_ready(60), local.reason
        code, body = await readyz(app)
    assert (code, body) == (200, {"status": "ready",
                                  "backends": {"local": {"ready": True, "reason": None}}})


# -- a model that failed to load ------------------------------------------------------------


def test_the_registry_passes_the_retry_cap_to_the_local_backend(marian: Path) -> None:
    assert make_backend(marian, load_retry_max_s=42.0).config.load_retry_max_s == 42.0
    assert make_backend(marian).config.load_retry_initial_s == 5.0


async def test_a_model_that_appears_later_is_loaded_without_a_restart(
    marian: Path, tmp_path: Path,
) -> None:
    missing = tmp_path / "mounted-later"
    local = LocalTranslator(dataclasses.replace(
        local_config(local_model=str(missing), load_retry_max_s=0.8), load_retry_initial_s=0.2))
    async with app_with(backends=with_passthrough(local), backend="local") as app:

        async def retrying() -> dict[str, Any] | None:
            code, body = await readyz(app)
            assert code == 503, body
            reason = body["backends"]["local"]["reason"]
            return body if "attempt 2 failed; trying again in 0.4 s" in reason else None

        body = await until(retrying, 10, "the second failed attempt")
        reason = body["backends"]["local"]["reason"]
        assert "does not exist" in reason, reason
        assert (await app.client.get("/healthz")).status_code == 200

        # The volume is mounted: the checkpoint appears whole, as a rename.
        staged = tmp_path / "staged"
        make_test_model("marian", staged)
        staged.rename(missing)

        async def ready() -> bool:
            code, body = await readyz(app)
            return code == 200 and body["status"] == "ready"

        await until(ready, 60, "readyz 200 after the model appeared")
        info = {b["name"]: b for b in (await app.client.get("/v1/backends")).json()[
            "backends"]}["local"]["info"]
        assert info["load_failures"] >= 2 and info["load_attempts"] == info["load_failures"] + 1
        r = await app.client.post("/v1/translate",
                                  json={"texts": ["The user said hello."], "target": "de"})
        [seg] = r.json()["results"][0]["segments"]
        assert (seg["status"], seg["backend"]) == ("translated", "local"), seg


def _load_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "thinktrans-local-load"]


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("thinktrans-local")]


async def test_wait_ready_fails_fast_and_aclose_stops_the_retries(tmp_path: Path) -> None:
    # The default first delay (5 s): wait_ready must not sit through it.
    local = LocalTranslator(local_config(local_model=str(tmp_path / "nothing-here")))
    assert await local.wait_ready(timeout_s=60) is False
    await asyncio.sleep(0.05)  # the retry task has taken over the failure
    # Still before the second attempt: wait_ready did not sit through the delay.
    assert local.retrying == "the first attempt failed; trying again in 5 s", local.retrying
    assert await local.wait_ready(timeout_s=60) is False  # between attempts: at once
    assert local.retrying == "the first attempt failed; trying again in 5 s", local.retrying
    assert _load_tasks() and _worker_threads()

    await local.aclose()
    assert not _load_tasks(), "the retry task is left pending"
    attempts = local.load_attempts
    give_up = time.monotonic() + 5
    while _worker_threads():
        assert time.monotonic() < give_up, "the worker thread outlived aclose"
        await asyncio.sleep(0.02)
    assert local.reason == "the local backend is closed"
    assert await local.wait_ready(timeout_s=1) is False
    assert local.load_attempts == attempts == 1


async def test_aclose_while_a_retry_attempt_runs(tmp_path: Path) -> None:
    local = LocalTranslator(dataclasses.replace(
        local_config(local_model=str(tmp_path / "gone")), load_retry_initial_s=0.05))
    await local.start()
    assert await local.wait_ready(timeout_s=30) is False
    gate = threading.Event()

    async def second_attempt_queued() -> bool:
        return local.load_attempts >= 2

    local._executor.submit(gate.wait, 30)  # the next attempt queues behind this
    await until(second_attempt_queued, 5, "the second attempt")
    waiter = asyncio.create_task(local.wait_ready(timeout_s=30))
    await asyncio.sleep(0.05)
    assert not waiter.done()  # it waits for the attempt in flight
    await local.aclose()
    gate.set()
    assert await asyncio.wait_for(waiter, 60) is False
    assert not _load_tasks()


async def test_the_first_run_without_the_hub_says_what_to_do_and_segments_keep_one_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`thinktrans serve` on a hub model, no hub: the reason names the two ways to start at
    once; the first failure does not say "attempt 2"; every segment's error is the same line,
    without the retry schedule, which /readyz and the log carry."""
    local = LocalTranslator(dataclasses.replace(
        local_config(local_model="nobody/not-cached-here", load_retry_max_s=0.4),
        load_retry_initial_s=0.2))
    async with app_with(backends=with_passthrough(local), backend="local") as app:

        async def failed_once() -> dict[str, Any] | None:
            code, body = await readyz(app)
            assert code == 503, body
            return body if "failed; trying again" in body["backends"]["local"]["reason"] else None

        with caplog.at_level("ERROR", logger="models.local.local_translator"):
            body = await until(failed_once, 30, "the first failed attempt")
        first = body["backends"]["local"]["reason"]
        assert "THINKTRANS_BACKEND=passthrough" in first, first
        assert "thinktrans make-test-model" in first, first
        assert "the first attempt failed; trying again in 0.2 s" in first, first
        assert "attempt 2" not in first, first
        assert "trying again in 0.2 s" in caplog.text

        errors = set()
        for _ in range(3):  # across attempts and waits: one line
            r = await app.client.post("/v1/translate", json={"texts": ["Hello there."],
                                                             "target": "de"})
            [seg] = r.json()["results"][0]["segments"]
            assert seg["status"] == "error", seg
            errors.add(seg["error"])
            await asyncio.sleep(0.5)
        [error] = errors
        assert "not found locally" in error and "THINKTRANS_BACKEND=passthrough" in error
        assert "trying again" not in error and "attempt" not in error, error


@pytest.mark.engines("transformers")
async def test_the_no_model_hint_proposes_a_test_model_that_serves_the_default_target(
    models: dict[str, Path],
) -> None:
    """A zh-CN operator's first `thinktrans serve` without the hub: the test model the reason
    proposes serves zh-CN. Followed (the session's checkpoint of that family), the default
    target is translated and the instance is ready, not degraded."""
    local = LocalTranslator(dataclasses.replace(
        local_config(local_model="nobody/not-cached-here", load_retry_max_s=0.4),
        load_retry_initial_s=0.2))
    async with app_with(backends=with_passthrough(local), backend="local",
                        default_locale="zh-CN") as app:

        async def failed_once() -> str | None:
            _, body = await readyz(app)
            reason: str = body["backends"]["local"]["reason"]
            return reason if "failed; trying again" in reason else None

        reason = await until(failed_once, 30, "the first failed attempt")
    proposed = re.search(r"`thinktrans make-test-model --family (\w+) DIR`", reason)
    assert proposed is not None, reason
    followed = make_backend(models[proposed[1]])
    async with app_with(backends=with_passthrough(followed), backend="local",
                        default_locale="zh-CN") as app:
        assert await followed.wait_ready(60), followed.reason
        code, body = await readyz(app)
        assert (code, body["status"]) == (200, "ready"), body
        r = await app.client.post("/v1/translate", json={"texts": ["The user said hello."]})
        [seg] = r.json()["results"][0]["segments"]
        assert (seg["status"], seg["backend"], seg["target"]) == (
            "translated", "local", "zh-CN"), seg
