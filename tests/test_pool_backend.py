"""The sidecar's `pool` backend without Ray: its ``PoolInfo`` alone, and the backend against
an ``httpx.MockTransport`` that answers ``/v1/info`` and ``/v1/batch`` as a replica does."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest

import models.pool_info
from models.base import Job
from models.errors import BackendError, BackendUnavailable, Stopped, Throttled
from models.pool_info import DEFAULT_CALL_TEXTS, REFRESH_GAP_S, PoolInfo, PoolLimits
from models.pooled import PoolTranslator
from tests.configs import pool_config

# As pool/replica.py's /v1/info answers a ready replica.
INFO: dict[str, Any] = {
    "ready": True, "reason": None, "max_batch_size": 2, "max_text_chars": 500,
    "max_call_chars": 4000, "max_call_bytes": 65536, "engine": "ctranslate2",
    "default_model": "nllb", "models": [{"model": "nllb", "languages": ["de"]}],
    "languages": ["de", "zh-Hans"], "identity": "abc", "checked_output": True}
DEFAULTS = PoolLimits(DEFAULT_CALL_TEXTS, 100, 200, 300)


class Clock:
    """``time`` as ``models.pool_info`` sees it: moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Reads:
    """A ``check`` that counts its calls and says when one came."""

    def __init__(self) -> None:
        self.count = 0
        self.came = asyncio.Event()

    async def __call__(self) -> None:
        self.count += 1
        self.came.set()


def test_the_info_gives_the_defaults_until_the_pool_has_said_its_own() -> None:
    info = PoolInfo(DEFAULTS, check=Reads(), up=lambda: True)
    assert info.limits() == DEFAULTS
    assert info.languages() is None and info.catalog() == [] and info.identity is None
    assert info.supports("ja", None) and info.checked_output
    assert info.resolve_model(None, "en", "de") is None
    info.take({**INFO, "max_call_bytes": 0, "checked_output": False})
    assert info.limits() == PoolLimits(2, 500, 4000, 300)  # 0 is no limit: the default's
    assert info.supports("de-AT", None) and info.supports("zh-CN", None)
    assert not info.supports("ja", None) and info.supports("ja", "some-model")
    assert info.catalog() == INFO["models"] and info.identity == "abc"
    assert not info.checked_output
    assert info.resolve_model(None, "en", "de") == "nllb"
    assert info.resolve_model("m2m", "en", "de") == "m2m"


async def test_the_info_forgets_served_models_with_another_deployment() -> None:
    reads = Reads()
    info = PoolInfo(DEFAULTS, check=reads, up=lambda: True)
    info.take(INFO)
    info.heard(None, "en", "de", {"model": "nllb-de", "identity": "abc"})
    assert info.resolve_model(None, "en", "de") == "nllb-de"
    info.take(INFO)  # the same deployment: the pair's model stands
    assert info.resolve_model(None, "en", "de") == "nllb-de"
    info.take({**INFO, "identity": "xyz"})
    assert info.resolve_model(None, "en", "de") == "nllb"
    assert reads.count == 0  # answers that named /v1/info's identity asked for no read
    await info.aclose()


async def test_an_answer_naming_another_identity_reads_the_info_again_once_a_gap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(models.pool_info, "time", clock)
    reads = Reads()
    info = PoolInfo(DEFAULTS, check=reads, up=lambda: True)
    info.take(INFO)
    try:
        for _ in range(3):
            info.heard(None, "en", "de", {"identity": "new"})
        async with asyncio.timeout(60):
            await reads.came.wait()
        assert reads.count == 1
        reads.came.clear()
        clock.now += REFRESH_GAP_S - 0.1
        info.refresh_soon()
        await asyncio.sleep(0)
        assert reads.count == 1  # within the gap: no second read
        clock.now += 0.2
        info.refresh_soon()
        async with asyncio.timeout(60):
            await reads.came.wait()
        assert reads.count == 2
    finally:
        await info.aclose()


async def test_the_info_reads_again_while_up_only_and_stops_when_closed() -> None:
    up = False
    reads = Reads()

    async def check() -> None:
        await reads()
        raise BackendUnavailable("down")  # a failed read is the check's to report

    info = PoolInfo(DEFAULTS, check=check, up=lambda: up)
    info.refresh_s = 0.0
    info.start()
    for _ in range(20):  # turns of the loop while down: none reads
        await asyncio.sleep(0)
    assert reads.count == 0
    up = True
    async with asyncio.timeout(60):
        await reads.came.wait()
    await info.aclose()
    count = reads.count
    for _ in range(20):
        await asyncio.sleep(0)
    assert reads.count == count and count >= 1


class Replica:
    """``/v1/info`` and ``/v1/batch`` as pool/replica.py answers them; ``info`` and the
    batch answers scripted, each request recorded."""

    def __init__(self) -> None:
        self.info: dict[str, Any] = dict(INFO)
        self.answers: list[httpx.Response] = []
        self.calls: list[dict[str, Any]] = []
        self.info_reads = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            self.info_reads += 1
            return httpx.Response(200 if self.info["ready"] else 503, json=self.info)
        body = json.loads(request.content)
        self.calls.append(body)
        if self.answers:
            return self.answers.pop(0)
        return httpx.Response(200, json={
            "translations": [f"de:{t}" for t in body["texts"]], "identity": self.info["identity"],
            "model": "nllb-de", "client": body["sidecar"]})


def problem(status: int, slug: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json={"type": f"urn:thinktrans:problem:{slug}",
                                        "title": slug, "status": status, "detail": "why"},
                          headers={"content-type": "application/problem+json", **(headers or {})})


def backend_for(replica: Replica) -> PoolTranslator:
    return PoolTranslator(pool_config(httpx.MockTransport(replica), pool_url="http://pool",
                                      pool_client_id="me"))


async def test_the_backend_follows_the_pools_info_and_sends_a_batch() -> None:
    replica = Replica()
    backend = backend_for(replica)
    assert not backend.ready and backend.reason == "waiting for the pool's first answer"
    assert backend.supports("en", "ja")  # any, until the pool has said
    await backend.start()
    try:
        assert await backend.wait_ready(60)
        assert backend.supports("en", "de") and not backend.supports("en", "ja")
        assert backend.languages() == ["de", "zh-Hans"]
        assert backend.cache_identity(None, "en", "de") == "pool|abc|None"
        assert backend.info() == {"url": "http://pool", "client_id": "me", "throttled": 0,
                                  "engine": "ctranslate2", "max_batch_size": 2,
                                  "identity": "abc", "spans": {"masked": 0, "fallback": 0}}
        out = await backend.run(Job(["a", "b", "c"], "en", "de"))
        assert out == ["de:a", "de:b", "de:c"]
        assert [c["texts"] for c in replica.calls] == [["a", "b"], ["c"]]  # max_batch_size
        assert all(c["sidecar"] == "me" and c["deadline_ms"] is None for c in replica.calls)
        assert backend.resolve_model(None, "en", "de") == "nllb-de"
    finally:
        await backend.aclose()


async def test_the_backend_is_down_while_the_pool_is_not_ready() -> None:
    replica = Replica()
    replica.info.update(ready=False, reason="model not loaded")
    backend = backend_for(replica)
    await backend.start()
    try:
        assert not await backend.wait_ready(60)
        assert "503" in (backend.reason or "")
        replica.info.update(ready=True, reason=None)
        await backend._check()  # what the probe does
        assert backend.ready and backend.reason is None
    finally:
        await backend.aclose()


async def identity_becomes(backend: PoolTranslator, identity: str) -> None:
    """Wait (60 s at most) for the backend's cache identity to name ``identity``."""
    async with asyncio.timeout(60):
        while backend.cache_identity(None, "en", "de") != f"pool|{identity}|None":
            await asyncio.sleep(0.01)


async def test_a_413_and_a_new_identity_make_the_backend_read_the_info_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(models.pool_info, "time", clock)
    replica = Replica()
    backend = backend_for(replica)
    await backend.start()
    try:
        assert await backend.wait_ready(60)
        reads = replica.info_reads
        replica.info.update(max_batch_size=1, identity="xyz")  # reconfigured: fewer a call
        replica.answers.append(problem(413, "payload-too-large"))
        with pytest.raises(BackendError):
            await backend.run(Job(["a", "b"], "en", "de"))
        await identity_becomes(backend, "xyz")
        assert replica.info_reads == reads + 1 and backend.ready
        assert await backend.run(Job(["a", "b"], "en", "de")) == ["de:a", "de:b"]
        assert [c["texts"] for c in replica.calls[1:]] == [["a"], ["b"]]  # cut to its limit
        assert replica.info_reads == reads + 1  # answers of /v1/info's identity: no read
        clock.now += REFRESH_GAP_S
        replica.info["identity"] = "redeployed"  # answers name it before /v1/info is read
        assert await backend.run(Job(["a"], "en", "de")) == ["de:a"]
        await identity_becomes(backend, "redeployed")
        assert replica.info_reads == reads + 2
    finally:
        await backend.aclose()


async def test_an_over_cap_429_throttles_the_backend_and_keeps_it_up() -> None:
    replica = Replica()
    replica.answers.append(problem(429, "over-cap", {"retry-after": "7"}))
    backend = backend_for(replica)
    await backend.start()
    try:
        assert await backend.wait_ready(60)
        with pytest.raises(Throttled) as held:
            await backend.run(Job(["a"], "en", "de"))
        assert held.value.retry_after_s == 7
        assert backend.ready and backend.info()["throttled"] == 1
    finally:
        await backend.aclose()


async def test_a_preview_told_to_stop_gives_its_call_up_and_a_stop_from_the_pool_is_one() -> None:
    """A preview's call in flight is given up once its job is told to stop (segments came
    to wait for this backend's slots): ``Stopped``, its request cancelled. The pool's own
    409 ``preview-stopped`` is ``Stopped`` too; neither takes the backend down."""
    held, gave_up = asyncio.Event(), asyncio.Event()

    class Holding(Replica):
        """Holds the first preview call until its sender gives it up."""

        async def __call__(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/v1/batch" and not held.is_set():
                self.calls.append(json.loads(request.content))
                held.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    gave_up.set()
                    raise
            return await super().__call__(request)

    replica = Holding()
    backend = backend_for(replica)
    await backend.start()
    try:
        assert await backend.wait_ready(60)
        stop = threading.Event()
        running = asyncio.create_task(backend.run(Job(["the user"], "en", "de", preview=True,
                                                      stop=stop)))
        await asyncio.wait_for(held.wait(), 60)
        assert replica.calls[0]["preview"] is True
        stop.set()
        with pytest.raises(Stopped):
            await asyncio.wait_for(running, 60)
        assert gave_up.is_set()
        replica.answers.append(problem(409, "preview-stopped"))
        with pytest.raises(Stopped):
            await backend.run(Job(["so"], "en", "de", preview=True, stop=threading.Event()))
        assert await backend.run(Job(["so"], "en", "de", preview=True,
                                     stop=threading.Event())) == ["de:so"]
        assert backend.ready
    finally:
        await backend.aclose()
