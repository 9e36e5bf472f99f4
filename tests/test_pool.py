"""The shared pool: `thinktrans pool` on a local Ray instance (one per module, 127.0.0.1) with
a test checkpoint, and `thinktrans serve` sidecars whose backend is `pool`, over real HTTP.

The Ray tests skip only where Ray Serve is not installed (the `pool` extra); the backend's
own tests need no Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from models.base import Job
from models.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    Expired,
    RateLimited,
    UnsupportedLanguage,
)
from models.pooled import PoolTranslator, _parts
from models.spans import Glossary, Protected, SpanFinder
from service.tools.testmodel import make_test_model
from tests.configs import call_limits, lanes, pool_config
from tests.configs import clients as make_clients
from tests.conftest import (
    Server,
    check_stream,
    deltas,
    free_port,
    post_chunks,
    read_until,
    segments,
    served,
)

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = [f"The test number {i} checks the parser and then runs the loop again. "
             for i in range(12)]
# Long enough that calls from two sidecars land in one merged batch (the test asserts it).
BATCH_WAIT_MS = 300
TOKEN = "pool-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A pool's start (Ray, Serve, the one-time conversion) takes minutes on a loaded
# machine: this only stops a hang.
POOL_READY_S = 600.0


def _ray() -> Any:
    return pytest.importorskip(
        "ray.serve", reason="Ray Serve is not installed: pip install 'thinktrans[pool]'")


@dataclass
class Pool:
    """`thinktrans pool` in its own process, and the checkpoint it serves."""

    server: Server
    model: Path
    ct2: Path

    @property
    def url(self) -> str:
        return self.server.url

    def stats(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/v1/stats", headers=AUTH, timeout=10).json()
        return body


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    _ray()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_test_model("marian", Path(tmp) / "marian-en-de")
        chinese = make_test_model("marian", Path(tmp) / "marian-en-zh", target_lang="zh")
        ct2 = Path(tmp) / "ct2"
        with served("pool", ready_s=POOL_READY_S, THINKTRANS_LOCAL_MODEL=str(model),
                    THINKTRANS_LOCAL_MARIAN_MODELS=f"en-zh={chinese}",
                    THINKTRANS_LOCAL_CT2_CACHE=str(ct2),
                    THINKTRANS_POOL_BATCH_WAIT_MS=str(BATCH_WAIT_MS),
                    THINKTRANS_POOL_TOKEN=TOKEN, HF_HUB_OFFLINE="1",
                    RAY_USAGE_STATS_ENABLED="0") as server:
            yield Pool(server, model, ct2)


# A deadline far past what the pool takes on a loaded machine, for tests that check what
# the pool translated (the default, 3 s, let a busy machine's segments out untranslated).
LONG_DEADLINE = {"THINKTRANS_DEADLINE_MS": "120000"}


def _sidecar_env(pool: Pool, chain: str = "pool", **extra: str) -> dict[str, str]:
    return {"THINKTRANS_BACKEND": chain, "THINKTRANS_POOL_URL": pool.url,
            "THINKTRANS_POOL_TOKEN": TOKEN,
            "THINKTRANS_DEFAULT_LOCALE": "de",
            # Random weights write noise in no language: the output check would refuse it.
            "THINKTRANS_CHECK_OUTPUT_LANGUAGE": "false", **extra}


async def _translate(url: str, texts: list[str]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        resp = await client.post("/v1/translate", json={"texts": texts, "target": "de"})
        assert resp.status_code == 200, resp.text
        return [seg for result in resp.json()["results"] for seg in result["segments"]]


async def test_two_sidecars_share_the_pool_and_their_batches_merge(pool: Pool) -> None:
    with served(**_sidecar_env(pool, **LONG_DEADLINE)) as one, \
            served(**_sidecar_env(pool, **LONG_DEADLINE)) as two:
        for sidecar in (one, two):  # warm: the measured calls leave at once
            await _translate(sidecar.url, ["A first sentence to warm up the sidecar."])
        before = pool.stats()
        first, second = await asyncio.gather(
            _translate(one.url, ["".join(SENTENCES[:6])]),
            _translate(two.url, ["".join(SENTENCES[6:])]))
    for segs in (first, second):
        assert [s["status"] for s in segs] == ["translated"] * 6, segs
        assert {s["backend"] for s in segs} == {"pool"}
        assert all(s["text"] != s["original"] for s in segs)
    after = pool.stats()
    assert after["model_segments"] - before["model_segments"] == 12
    # The two sidecars' calls ran as one engine batch.
    assert after["merged_batches"] > before["merged_batches"], after
    assert {"segments": 12, "sidecars": 2} in [
        {k: b[k] for k in ("segments", "sidecars")} for b in after["recent"]], after["recent"]


async def test_expired_work_never_reaches_the_model(pool: Pool) -> None:
    before = pool.stats()

    async def call(client: httpx.AsyncClient, texts: list[str], deadline_ms: float
                   ) -> httpx.Response:
        return await client.post("/v1/batch", json={
            "texts": texts, "source": "en", "target": "de", "deadline_ms": deadline_ms})

    async with httpx.AsyncClient(base_url=pool.url, headers=AUTH, timeout=60) as client:
        # Due before the batch window closes: it waits, expires, and is answered unrun.
        late, live, gone = await asyncio.gather(
            call(client, SENTENCES[:3], BATCH_WAIT_MS / 4),
            call(client, SENTENCES[3:5], 30_000),
            call(client, SENTENCES[5:6], 0))
    assert live.status_code == 200 and len(live.json()["translations"]) == 2
    for resp in (late, gone):
        assert resp.status_code == 504, resp.text
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert resp.json()["type"].endswith(":expired")
    after = pool.stats()
    assert after["model_segments"] - before["model_segments"] == 2  # the live call's only
    assert after["expired_segments"] - before["expired_segments"] == 4


def with_deadline(value: str) -> bytes:
    """A call's body with ``value`` as its deadline, written as it is (NaN, a string)."""
    return ('{"texts": ["Hello."], "target": "de", "deadline_ms": ' + value + "}").encode()


async def test_the_pool_refuses_bad_calls_with_problems(pool: Pool) -> None:
    async with httpx.AsyncClient(base_url=pool.url, headers=AUTH, timeout=30) as client:
        empty = await client.post("/v1/batch", json={"texts": [], "target": "de"})
        too_many = await client.post("/v1/batch", json={"texts": ["a"] * 65, "target": "de"})
        pair = await client.post("/v1/batch", json={"texts": ["Hello."], "source": "en",
                                                    "target": "ja"})
        garbage = await client.post("/v1/batch", content=b"{not json")
        # JSON as Python writes it, NaN and all: a 422, never a 500; finite deadlines serve.
        deadlines = {value: await client.post("/v1/batch", content=with_deadline(value))
                     for value in ("NaN", "Infinity", '"100"', "-1", "1e300")}
        info = await client.get("/v1/info")
        good = await client.post("/v1/batch", json={"texts": ["Hello."], "target": "de"})
        again = await client.get("/v1/info")
        unauthorized = [await client.post("/v1/batch", json={"texts": ["Hello."],
                                                             "target": "de"}, headers=h)
                        for h in ({"Authorization": ""}, {"Authorization": "Bearer wrong"})]
        health = await client.get("/readyz", headers={"Authorization": ""})
    for resp, status in ((empty, 422), (too_many, 413), (pair, 422), (garbage, 422),
                         *((r, 401) for r in unauthorized)):
        assert resp.status_code == status, resp.text
        assert resp.headers["content-type"].startswith("application/problem+json")
    assert "texts" in empty.json()["detail"] and "at most 64" in too_many.json()["detail"]
    for value in ("NaN", "Infinity", '"100"'):
        resp = deadlines[value]
        assert resp.status_code == 422, (value, resp.text)
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert resp.json()["detail"].startswith("deadline_ms: "), resp.text
    assert deadlines["-1"].status_code == 504, deadlines["-1"].text  # passed already
    assert deadlines["-1"].json()["type"].endswith(":expired")
    assert deadlines["1e300"].status_code == 200, deadlines["1e300"].text
    assert pair.json()["type"].endswith(":unsupported-language")
    assert health.status_code == 200  # probes of orchestrators need no token
    body = info.json()
    assert body["ready"] is True and body["languages"] == ["de", "zh-Hans"] and body["identity"]
    # The cache key the sidecars use does not move with the work done.
    assert again.json()["identity"] == good.json()["identity"] == body["identity"]


async def test_a_call_is_bounded_in_characters_and_answered_at_its_deadline(pool: Pool) -> None:
    """Texts and calls over the pool's character limits get a 413 that names the setting;
    a call whose deadline passes while others' work holds the engine is answered 504 then,
    not when that work is done."""
    sentence = "The loop reads the file, checks the parser and writes one more line. "
    text = (sentence * 40)[:2000]  # the default pool_max_text_chars

    async def call(client: httpx.AsyncClient, texts: list[str], deadline_ms: float | None = None
                   ) -> tuple[httpx.Response, float]:
        resp = await client.post("/v1/batch", json={
            "texts": texts, "source": "en", "target": "de", "deadline_ms": deadline_ms})
        return resp, time.monotonic()

    async with httpx.AsyncClient(base_url=pool.url, headers=AUTH, timeout=120) as client:
        (too_long, _), (too_much, _) = await asyncio.gather(
            call(client, [text + "x"]), call(client, [text] * 17))
        # Calls at the limit hold the engine a while: as many as keep it busy some seconds
        # past the late call on this machine, timed by one of them.
        one_started = time.monotonic()
        await call(client, [text] * 16)
        turns = min(48, max(4, math.ceil(10.0 / max(time.monotonic() - one_started, 0.05))))
        busy = [asyncio.create_task(call(client, [text] * 16)) for _ in range(turns)]
        await asyncio.sleep(1.0)
        late, answered = await call(client, SENTENCES[:1], deadline_ms=1000)
        done = await asyncio.gather(*busy)
    assert late.status_code == 504 and late.json()["type"].endswith(":expired"), late.text
    assert [r.status_code for r, _ in done] == [200] * turns
    # Answered while the engine was still busy with the others: at its deadline, not when
    # their work was done.
    assert max(t for _, t in done) > answered
    for resp, setting in ((too_long, "THINKTRANS_POOL_MAX_TEXT_CHARS"),
                          (too_much, "THINKTRANS_POOL_MAX_CALL_CHARS")):
        assert resp.status_code == 413, resp.text
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert setting in resp.json()["detail"], resp.text


def test_a_chunked_body_is_read_no_further_than_the_limit(pool: Pool) -> None:
    """A body with no Content-Length, sent in chunks (64 KiB each 10 ms): the replica answers
    413 once it is past pool_max_call_bytes (1 MiB), not after reading all 64 MiB of it.
    (Serve's proxy reads what comes meanwhile, until it closes the connection.)"""
    url = urlsplit(pool.url)
    frame = b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16))
    sent = 0
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/batch HTTP/1.1\r\nHost: pool\r\nAuthorization: Bearer "
                     + TOKEN.encode() + b"\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        try:
            while sent < 64 << 20 and not select.select([sock], [], [], 0)[0]:
                sock.sendall(frame)
                sent += len(frame)
                time.sleep(0.01)
        except OSError:  # the pool closed the connection after its answer
            pass
        sock.settimeout(30)
        answer = b""
        with contextlib.suppress(TimeoutError):
            while b"\r\n\r\n" not in answer or b"}" not in answer:
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert b"THINKTRANS_POOL_MAX_CALL_BYTES" in answer, answer[:600]
    assert sent < 32 << 20, sent  # 1 MiB, and what came while the answer went out


async def test_a_test_checkpoint_in_the_pool_is_served_as_local_serves_it(pool: Pool) -> None:
    """Random weights write noise in no language: `local` turns the sidecars' output check
    off for a test checkpoint, and the pool's /v1/info tells its sidecars to do the same.
    English to Chinese and to German through a sidecar with the check on is translated, not
    refused (the noise of this vocabulary reads as Chinese: German is what it refused)."""
    env = _sidecar_env(pool, **LONG_DEADLINE)
    del env["THINKTRANS_CHECK_OUTPUT_LANGUAGE"]  # the default: on
    info = httpx.get(f"{pool.url}/v1/info", headers=AUTH, timeout=10).json()
    text = "The parser reads the file and then writes one more line."
    with served(**env) as sidecar:
        async with httpx.AsyncClient(base_url=sidecar.url, timeout=300) as client:
            answers = [await client.post("/v1/translate", json={"texts": [text],
                                                                "target": target})
                       for target in ("zh", "de")]
    for resp in answers:
        assert resp.status_code == 200, resp.text
        [seg] = [seg for result in resp.json()["results"] for seg in result["segments"]]
        assert seg["status"] == "translated" and seg["backend"] == "pool", seg
        assert seg["text"] != seg["original"]
    assert info["checked_output"] is False


SPAN_TEXTS = [
    "First I run `pip install -e .` and then open config.yaml to check the version 2.13.0.",
    "The sidecar posts each batch to https://pool.example.com/v1/batch within 250 ms.",
]


async def test_spans_sent_to_the_pool_come_back_kept_and_calls_still_merge(pool: Pool) -> None:
    """Two sidecars' pool backends over real HTTP to the module's pool, at once: one sends
    texts with protected spans and a glossary term, the other plain text. Every span's
    ``out`` is in its translation (random weights lose the placeholders; the pool's runs
    fallback keeps them), the answers say how, and the two calls ran as one engine batch.
    Spans the pool cannot take are a 422 that says which."""
    finder = SpanFinder()
    protected = [finder.find(text, Glossary.of({"sidecar": "Beiwagen"})) for text in SPAN_TEXTS]
    assert all(p is not None and len(p.spans) == 3 for p in protected)
    backends = [PoolTranslator(pool_config(pool_url=pool.url, pool_token=TOKEN,
                                                      pool_client_id=name))
                for name in ("with-spans", "without")]
    try:
        for backend in backends:
            await backend.start()
            assert await backend.wait_ready(30), backend.reason
        before = pool.stats()
        kept, plain = await asyncio.gather(
            backends[0].run(Job(SPAN_TEXTS, "en", "de", protected=protected)),
            backends[1].run(Job(SENTENCES[:3], "en", "de")))
        spans_info = [backend.info()["spans"] for backend in backends]
    finally:
        for backend in backends:
            await backend.aclose()
    for spans, out in zip(protected, kept, strict=True):
        assert spans is not None and spans.missing(out) == [], out
    assert "Beiwagen" in kept[1] and "sidecar" not in kept[1]
    assert len(plain) == 3 and all(plain)
    assert spans_info[1] == {"masked": 0, "fallback": 0}
    assert isinstance(spans_info[0], dict) and sum(spans_info[0].values()) == 2, spans_info
    after = pool.stats()
    assert after["merged_batches"] > before["merged_batches"], after
    assert {"segments": 5, "sidecars": 2} in [
        {k: b[k] for k in ("segments", "sidecars")} for b in after["recent"]], after["recent"]
    text = SPAN_TEXTS[0]
    async with httpx.AsyncClient(base_url=pool.url, headers=AUTH, timeout=30) as client:
        bad = [await client.post("/v1/batch", json={"texts": [text], "target": "de",
                                                    "spans": spans})
               for spans in ([[[20, 30, "path", "x"], [10, 12, "code", "y"]]],  # not in order
                             [[[0, 500, "code", "x"]]],  # past the text's end
                             [[[0, 5, "code", 5]]],  # out not a string
                             [[], []])]  # two lists for one text
    for resp, where in zip(bad, ("spans.0.1", "spans.0.0", "spans.0.0.3", "spans"),
                           strict=True):
        assert resp.status_code == 422, resp.text
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert resp.json()["detail"].startswith(where), resp.json()


async def test_a_served_sidecar_keeps_every_span_of_the_corpus_through_the_pool(
        pool: Pool) -> None:
    """The corpus's English sentences (the pool serves English to German) posted to a
    served sidecar whose chain is the pool, with a glossary: every segment comes out
    translated, with every span of its original and every term as given."""
    from tests.test_spans_corpus import GLOSSARY, check, texts

    sentences = texts(langs={"en"})
    with served("serve", **_sidecar_env(pool, **LONG_DEADLINE)) as sidecar:
        async with httpx.AsyncClient(base_url=sidecar.url, timeout=300) as client:
            resp = await client.post("/v1/translate", json={
                "texts": sentences, "target": "de", "glossary": GLOSSARY})
    assert resp.status_code == 200, resp.text
    segments = [seg for result in resp.json()["results"] for seg in result["segments"]]
    sent, translated = check(segments)
    assert sent >= len(sentences) // 2 and translated == sent


async def test_a_segment_call_stops_a_preview_running_on_the_pool(pool: Pool) -> None:
    """Preview calls that hold the replica's engine a while each, one of them running (as
    /v1/stats says) when a segment call comes: the running one is answered 409
    preview-stopped and counted, the segment call is served, and the previews that waited
    run after it."""
    sentence = "The loop reads the file, checks the parser and writes one more line. "
    text = (sentence * 40)[:2000]  # the default pool_max_text_chars
    order: list[str] = []

    async with httpx.AsyncClient(base_url=pool.url, headers=AUTH, timeout=300) as client:
        async def call(name: str, texts: list[str], preview: bool) -> httpx.Response:
            resp = await client.post("/v1/batch", json={
                "texts": texts, "source": "en", "target": "de", "preview": preview,
                "sidecar": "previewer" if preview else "writer"})
            order.append(name)
            return resp

        before = pool.stats()
        previews = [asyncio.create_task(call(f"preview-{i}", [text] * 16, True))
                    for i in range(4)]
        give_up = time.monotonic() + 300
        while not pool.stats()["preview_running"]:
            assert time.monotonic() < give_up, "no preview call ran"
            await asyncio.sleep(0.02)
        segment = await call("segment", [SENTENCES[0]], False)
        answers = await asyncio.gather(*previews)
    assert segment.status_code == 200, segment.text
    assert len(segment.json()["translations"]) == 1
    stopped = [resp for resp in answers if resp.status_code == 409]
    assert stopped and all(resp.status_code in (200, 409) for resp in answers), answers
    for resp in stopped:
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert resp.json()["type"].endswith(":preview-stopped"), resp.text
    assert order.index("segment") < len(order) - 1, order  # previews waited behind it
    after = pool.stats()
    assert after["stopped_segments"] - before["stopped_segments"] == 16 * len(stopped)
    assert after["clients"]["previewer"]["stopped_segments"] >= 16 * len(stopped)
    assert after["clients"]["previewer"]["failed_segments"] == 0
    assert not after["preview_running"]


async def test_a_pool_stopped_mid_run_leaves_every_stream_whole(pool: Pool) -> None:
    """Runs last: it stops the module's pool. One sidecar falls through to its local model,
    the other, with only the pool, sends the originals as `error`; nothing is lost."""
    # Sentences of their own: none is in the sidecars' caches from an earlier test.
    text = "".join(f"Another check, number {i}, reads the file and writes a line. "
                   for i in range(24))
    chunks = deltas(text, 40)
    local = {"THINKTRANS_LOCAL_MODEL": str(pool.model), "HF_HUB_OFFLINE": "1",
             "THINKTRANS_LOCAL_CT2_CACHE": str(pool.ct2)}
    with served(**_sidecar_env(pool, "pool,local", **local)) as chained, \
            served(**_sidecar_env(pool)) as alone:
        clients = [httpx.AsyncClient(base_url=s.url, timeout=60) for s in (chained, alone)]
        try:
            for client in clients:
                resp = await client.post("/v1/streams", json={"stream_id": "s", "target": "de"})
                assert resp.status_code == 201, resp.text
            half = len(chunks) // 2
            for i, chunk in enumerate(chunks):
                if i == half:
                    await asyncio.to_thread(pool.server.terminate, 90)
                for client in clients:
                    resp = await post_chunks(client, "s", [chunk])
                    assert resp.status_code in (200, 202), resp.text
                await asyncio.sleep(0.05)
            for client in clients:
                await client.post("/v1/streams/s/close")
            got = [await read_until(c, "s", timeout_s=60) for c in clients]
        finally:
            for client in clients:
                await client.aclose()
    for events in got:
        check_stream(events, text)
    chained_segs, alone_segs = (segments(events) for events in got)
    assert {s["backend"] for s in chained_segs} <= {"pool", "local"}
    assert "pool" in {s["backend"] for s in chained_segs}
    assert chained_segs[-1]["backend"] == "local"  # after the pool was gone
    assert all(s["status"] == "translated" for s in chained_segs)
    statuses = {s["status"] for s in alone_segs}
    assert "error" in statuses and statuses <= {"translated", "error"}, statuses
    # The pool stopped cleanly, and said all it said as JSON lines: its own, its replica's,
    # Ray's and Serve's (Ray's coloured text before; a retried graceful_shutdown at stop).
    log = pool.server.log()
    assert pool.server.proc.returncode == 0, log[-3000:]
    assert "graceful_shutdown" not in log, log[-3000:]
    text = [line for line in log.splitlines()
            if line.strip() and not line.startswith("thinktrans pool: ") and not _json(line)]
    assert not text, text[:10]
    assert any(json.loads(line).get("logger") == "models.local.local_translator"
               for line in log.splitlines() if _json(line))  # the replica's own, as ours


def _json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_thinktrans_pool_refuses_a_gpu_model_with_no_gpu_before_ray_starts(tmp_path: Path) -> None:
    _ray()
    env = {k: v for k, v in os.environ.items() if not k.startswith("THINKTRANS_")}
    env.update(THINKTRANS_LOCAL_MODEL=str(tmp_path), THINKTRANS_LOCAL_DEVICE="cuda:0")
    done = subprocess.run([sys.executable, "-m", "service.cli", "pool", "--port",
                           str(free_port())], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "THINKTRANS_POOL_NUM_GPUS" in done.stderr and "Ray" in done.stderr


def _replica(engine: Any, max_batch_size: int, **settings: Any) -> Any:
    """A replica of the pool's deployment without Serve: its class as written, not Serve's
    ASGI wrapper, with ``engine`` for its translator, its limits and clients from the
    ``pool_*`` settings (``settings`` put over them)."""
    from pool.replica import Pool as Deployment
    from pool.turns import Turns

    cls = Deployment.func_or_class.__bases__[0]
    replica = object.__new__(cls)
    replica.translator = engine
    replica.limits = call_limits(**settings)
    replica.clients = make_clients(**settings)
    replica.turns = Turns(engine, lanes(replica.clients.weight, **settings), replica.clients,
                          timeout_s=5.0, max_batch_size=max_batch_size,
                          max_call_chars=replica.limits.max_call_chars)
    return replica


async def _run(replica: Any, calls: list[Any]) -> list[Any]:
    """The replica's batch function, as Serve's batch calls it."""
    answers: list[Any] = await type(replica).run.__wrapped__(replica, calls)
    return answers


async def test_engine_turns_take_every_call_that_waited_and_answer_each() -> None:
    """The replica's batch function without Serve, fairness off: calls that come while the
    engine runs go into the next turn together, oldest first, within max_batch_size; calls
    given up or past their deadline never reach the engine; an engine failure answers every
    call."""
    _ray()
    from models.pooled import PoolCall
    from pool.turns import Queued

    gate = asyncio.Event()
    seen: list[list[str]] = []

    class Engine:
        async def run_kept(self, job: Job) -> tuple[list[str], list[str | None]]:
            texts = list(job.texts)
            seen.append(texts)
            if len(seen) == 1:
                await gate.wait()
            if "boom" in texts:
                raise RuntimeError("an engine bug")
            return [t.upper() for t in texts], [None] * len(texts)

    replica = _replica(Engine(), 3, pool_fair=False)

    def run(_: Any, calls: list[Queued]) -> Any:
        return _run(replica, calls)

    def call(*texts: str, due: float | None = None) -> Queued:
        return Queued(PoolCall(texts=list(texts), target="de", sidecar=texts[0]), due,
                       texts[0])

    first = asyncio.create_task(run(replica, [call("a")]))
    while not seen:
        await asyncio.sleep(0.01)
    gone = call("y")
    gone.cancelled = True
    second = asyncio.create_task(run(replica, [call("b"), call("x", due=time.monotonic())]))
    third = asyncio.create_task(run(replica, [gone, call("c", "d"), call("e")]))
    await asyncio.sleep(0.05)
    gate.set()
    one, two, three = await asyncio.gather(first, second, third)
    assert seen == [["a"], ["b", "c", "d"], ["e"]]
    assert one == [["A"]] and two[0] == ["B"] and isinstance(two[1], Expired)
    assert isinstance(three[0], Expired) and three[1:] == [["C", "D"], ["E"]]
    assert replica.turns.tally.merged_batches == 1  # b with c, d: two senders
    assert (replica.turns.tally.expired_segments, replica.turns.tally.cancelled_segments) == (1, 1)
    failed = await run(replica, [call("boom"), call("boom")])
    assert [type(answer) for answer in failed] == [BackendError, BackendError]
    assert not replica.turns.lanes


async def test_a_turn_drops_calls_late_by_their_groups_turn_and_checks_each_answer() -> None:
    """Calls taken in one turn whose deadline passes, or whose sidecar gives up, while an
    earlier group runs never reach the engine; an engine answer of the wrong length fails
    its group's calls (the batcher's one output check), an engine bug its turn's calls;
    each is answered."""
    _ray()
    from models.errors import BadOutput
    from models.pooled import PoolCall
    from pool.turns import Queued

    gate = asyncio.Event()
    seen: list[list[str]] = []

    class Engine:
        async def run_kept(self, job: Job) -> tuple[list[str], list[str | None]]:
            texts = list(job.texts)
            seen.append(texts)
            if job.target == "ja":
                raise RuntimeError("an engine bug")
            if job.target == "de":
                await gate.wait()
                return [t.upper() for t in texts], [None] * len(texts)
            return [t.upper() for t in texts][:1], [None]  # one short

    replica = _replica(Engine(), 10)

    def call(target: str, *texts: str, due: float | None = None) -> Queued:
        return Queued(PoolCall(texts=list(texts), target=target), due)

    due = time.monotonic() + 0.2
    late, gone = call("fr", "late", due=due), call("fr", "gone")
    turn = asyncio.create_task(_run(replica, [call("de", "a"), late, gone, call("fr", "b", "c")]))
    while not seen:
        await asyncio.sleep(0.01)
    while time.monotonic() <= due:  # the de group runs past the late call's deadline
        await asyncio.sleep(0.01)
    gone.cancelled = True
    gate.set()
    de, expired, given_up, short = await asyncio.wait_for(turn, 60)
    assert seen == [["a"], ["b", "c"]]
    assert de == ["A"] and isinstance(expired, Expired) and isinstance(given_up, Expired)
    assert isinstance(short, BadOutput) and "1 outputs for 2 inputs" in str(short)
    assert (replica.turns.tally.expired_segments, replica.turns.tally.cancelled_segments) == (1, 1)
    [failed] = await _run(replica, [call("ja", "boom")])
    assert "the pool failed: RuntimeError" in str(failed)  # answered by its turn, not lost
    assert not replica.turns.lanes


async def test_a_turn_merges_calls_with_and_without_spans_and_answers_each_how() -> None:
    """Calls of two sidecars, one with spans, one without, for one pair: one engine call,
    each text with its own spans (or none), and each call with spans told how they were
    kept."""
    _ray()
    from models.pooled import PoolCall
    from pool.turns import Queued

    jobs: list[Job] = []

    class Engine:
        async def run_kept(self, job: Job) -> tuple[list[str], list[str | None]]:
            jobs.append(job)
            kept = [None if p is None else ("masked" if i % 2 else "fallback")
                    for i, p in enumerate(job.protected or [None] * len(job.texts))]
            return [t.upper() for t in job.texts], kept

    replica = _replica(Engine(), 10)
    spans = PoolCall(texts=["see a.py", "no spans", "run `x` now"], target="de", sidecar="one",
                     spans=[[[4, 8, "path", "a.py"]], [], [[4, 7, "code", "`x`"]]])
    plain = PoolCall(texts=["plain"], target="de", sidecar="two")
    queued = [Queued(spans, None, "one"), Queued(plain, None, "two")]
    answers = await _run(replica, queued)
    assert answers == [["SEE A.PY", "NO SPANS", "RUN `X` NOW"], ["PLAIN"]]
    [job] = jobs
    assert list(job.texts) == ["see a.py", "no spans", "run `x` now", "plain"]
    assert job.protected is not None
    assert [None if p is None else [(s.start, s.end, s.kind, s.out) for s in p.spans]
            for p in job.protected] == [[(4, 8, "path", "a.py")], None,
                                        [(4, 7, "code", "`x`")], None]
    assert all(p is None or p.text == t for p, t in zip(job.protected, job.texts, strict=True))
    assert queued[0].kept == {"masked": 0, "fallback": 2} and queued[1].kept is None
    assert replica.turns.tally.merged_batches == 1


def test_the_pool_checks_each_calls_spans() -> None:
    _ray()
    from pool.calls import parse_call
    from service.exceptions import InputError

    def parse(spans: Any, texts: tuple[str, ...] = ("abcdef",)) -> Any:
        body = {"texts": list(texts), "target": "de", "spans": spans}
        return parse_call(json.dumps(body).encode(), 8, call_limits())

    good = parse([[[0, 2, "code", "ab"], [2, 4, "term", "XY"]]])
    [protected] = good.protected()
    assert protected.text == "abcdef" and [s.out for s in protected.spans] == ["ab", "XY"]
    assert parse(None).protected() is None
    assert parse([[], []], ("a", "b")).protected() == [None, None]
    for spans, where in (([[[0, 2, "code", "ab"], [1, 4, "code", "x"]]], "spans.0.1"),
                         ([[[3, 3, "code", ""]]], "spans.0.0"),
                         ([[[-1, 2, "code", "x"]]], "spans.0.0"),
                         ([[[0, 7, "code", "x"]]], "spans.0.0"),
                         ([[[0, 2, "code"]]], "spans.0.0"),
                         ([[[0, 2, "code", None]]], "spans.0.0.3"),
                         ([[["0", 2, "code", "x"]]], "spans.0.0.0"),
                         ([[], []], "spans")):
        with pytest.raises(InputError) as caught:
            parse(spans)
        assert str(caught.value).startswith(where), (spans, str(caught.value))


def test_a_calls_deadline_is_a_finite_number_of_milliseconds_or_null() -> None:
    """NaN, infinities (which JSON as Python reads it allows), numbers too large for a float,
    strings and booleans are refused with a 422 naming ``deadline_ms``; a deadline of 0 or
    less, or a huge finite one, is a number like any other."""
    _ray()
    from pool.calls import parse_call
    from service.exceptions import InputError

    def parse(deadline: str) -> Any:
        return parse_call(with_deadline(deadline), 8, call_limits())

    for bad in ("NaN", "Infinity", "-Infinity", "1e400", '"100"', '"soon"', "true", "[1]"):
        with pytest.raises(InputError) as caught:
            parse(bad)
        assert str(caught.value).startswith("deadline_ms: "), (bad, str(caught.value))
        assert "finite number, or null" in str(caught.value)
    for good, value in (("-1", -1.0), ("0", 0.0), ("2500", 2500.0), ("1e300", 1e300),
                        ("null", None)):
        assert parse(good).deadline_ms == value


async def test_a_preview_call_gives_the_engine_its_previous_previews_and_checks_them() -> None:
    """A preview call's previous previews reach the engine as a preview job's, after a final
    call that came with it (previews never share a turn with segments); their count and
    size are checked."""
    _ray()
    from models.pooled import PoolCall
    from pool.calls import parse_call
    from pool.turns import Queued
    from service.exceptions import InputError, PayloadTooLarge

    jobs: list[Job] = []

    class Engine:
        async def run_kept(self, job: Job) -> tuple[list[str], list[str | None]]:
            jobs.append(job)
            return [t.upper() for t in job.texts], [None] * len(job.texts)

    replica = _replica(Engine(), 10, pool_max_text_chars=20, pool_max_call_chars=30)

    def parse(**body: Any) -> PoolCall:
        call: PoolCall = parse_call(json.dumps({"target": "de", **body}).encode(),
                                    replica.turns.max_batch_size, replica.limits)
        return call

    preview = parse(texts=["the user said", "so"], preview=True, previous=["der", None])
    final = parse(texts=["done."], previous=["ignored"])
    answers = await _run(replica, [Queued(preview, None), Queued(final, None)])
    assert answers == [["THE USER SAID", "SO"], ["DONE."]]
    final_job, preview_job = jobs
    assert list(final_job.texts) == ["done."] and not final_job.preview
    assert final_job.previous is None and final_job.stop is None
    assert preview_job.preview and list(preview_job.previous or []) == ["der", None]
    assert preview_job.stop is not None
    for previous, error in ((["a"], InputError),  # one for two texts
                            (["x" * 21, None], PayloadTooLarge),  # over max_text_chars
                            (["x" * 20, "y" * 11], PayloadTooLarge)):  # over max_call_chars
        with pytest.raises(error):
            parse(texts=["a", "b"], preview=True, previous=previous)


async def test_a_segment_call_stops_the_preview_turn_holding_the_engine() -> None:
    """A preview call whose decode holds the replica's engine (until its job is told to
    stop) is stopped when a segment call comes: answered ``Stopped`` and counted stopped;
    the segment call runs next, and a preview that came with it runs after it."""
    _ray()
    from models.errors import Stopped
    from models.pooled import PoolCall
    from pool.turns import Queued

    jobs: list[Job] = []
    decoding = asyncio.Event()

    class Engine:
        async def run_kept(self, job: Job) -> tuple[list[str], list[str | None]]:
            jobs.append(job)
            if len(jobs) == 1:  # the first preview decodes until it is told to stop
                assert job.preview and job.stop is not None
                decoding.set()
                while not job.stop.is_set():
                    await asyncio.sleep(0.01)
                raise Stopped("told to stop")
            return [t.upper() for t in job.texts], [None] * len(job.texts)

    replica = _replica(Engine(), 10)

    def call(client: str, *texts: str, preview: bool) -> Queued:
        return Queued(PoolCall(texts=list(texts), target="de", sidecar=client,
                                preview=preview), None, client)

    replica.clients.admit("p", 3, 0.0)  # as the route admits its calls
    first = asyncio.create_task(_run(replica, [call("p", "the user", "so", preview=True)]))
    await asyncio.wait_for(decoding.wait(), 60)
    assert replica.turns.lanes.preview_running
    later, segment = call("p", "later", preview=True), call("s", "done.", preview=False)
    stop = jobs[0].stop
    assert stop is not None and not stop.is_set() and not first.done()  # still decoding
    second = asyncio.create_task(_run(replica, [later, segment]))
    [stopped] = await asyncio.wait_for(first, 60)
    after, done = await asyncio.wait_for(second, 60)
    assert isinstance(stopped, Stopped) and done == ["DONE."] and after == ["LATER"]
    assert [list(job.texts) for job in jobs] == [["the user", "so"], ["done."], ["later"]]
    assert replica.turns.tally.stopped_segments == 2
    assert replica.clients.counts["p"].stopped_segments == 2
    assert replica.clients.counts["p"].failed_segments == 0
    assert not replica.turns.lanes and not replica.turns.lanes.preview_running


# -- the backend alone: no Ray needed ---------------------------------------------------------

INFO = {"ready": True, "reason": None, "max_batch_size": 2, "engine": "ctranslate2",
        "default_model": "nllb", "models": [], "languages": ["de", "zh-Hans"],
        "identity": "abc"}


def problem(status: int, slug: str, detail: str = "why") -> httpx.Response:
    return httpx.Response(status, json={"type": f"urn:thinktrans:problem:{slug}",
                                        "title": slug, "status": status, "detail": detail},
                          headers={"content-type": "application/problem+json"})


class ScriptedPool:
    """A pool's answers, one per /v1/batch call, in order; /v1/info answers INFO."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []
        self.auth: set[str] = set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.auth.add(request.headers.get("authorization", ""))
        if request.url.path == "/v1/info":
            return httpx.Response(200, json=INFO)
        body = json.loads(request.content)
        self.calls.append(body)
        if not self.answers:
            return httpx.Response(200, json={"translations": [f"de:{t}" for t in body["texts"]],
                                             "identity": "abc", "model": "nllb-de"})
        return self.answers.pop(0)


async def scripted(pool: ScriptedPool) -> PoolTranslator:
    backend = PoolTranslator(pool_config(httpx.MockTransport(pool), pool_url="http://pool",
                                         pool_token="t"))
    await backend.start()
    assert await backend.wait_ready(5)
    return backend


async def test_the_backend_maps_the_pools_answers_and_goes_down_only_when_it_is_down() -> None:
    pool = ScriptedPool(
        problem(504, "expired"), problem(503, "backend-unavailable", "model x not loaded"),
        problem(422, "unsupported-language"), problem(504, "backend-timeout"),
        httpx.Response(503, text="busy", headers={"retry-after": "1"}),  # Serve's backpressure
        httpx.Response(503, text="Request dropped due to backpressure (...)"),
        problem(503, "pool-not-ready", "model not loaded"))
    backend = await scripted(pool)
    try:
        for error in (Expired, BackendUnavailable, UnsupportedLanguage, BackendTimeout,
                      RateLimited, RateLimited):
            with pytest.raises(error):
                await backend.translate(["Hi."], source="en", target="de")
            assert backend.ready, error  # one call's trouble is that call's
        with pytest.raises(BackendUnavailable, match="not ready"):
            await backend.translate(["Hi."], source="en", target="de")
        assert not backend.ready
        await backend._check()  # what the probe does: ready again
        assert backend.ready
        for answer in (httpx.Response(404, text="no route"), httpx.Response(401)):
            pool.answers.append(answer)
            with pytest.raises(BackendUnavailable):
                await backend.translate(["Hi."], source="en", target="de")
            assert not backend.ready
            await backend._check()
        assert pool.auth == {"Bearer t"}
    finally:
        await backend.aclose()


def due_in(texts: list[str], deadline_s: float) -> Job:
    """An en -> de job due ``deadline_s`` from now, as the batcher hands it over."""
    return Job(texts, "en", "de", due=time.monotonic() + deadline_s)


async def test_the_backend_cuts_batches_at_the_pools_limit_and_learns_its_models() -> None:
    pool = ScriptedPool()
    backend = await scripted(pool)
    try:
        assert backend.resolve_model(None, "en", "de") == "nllb"  # the pool's default
        out = await backend.run(due_in(["a", "b", "c", "d", "e"], 5.0))
        assert out == ["de:a", "de:b", "de:c", "de:d", "de:e"]
        assert [len(c["texts"]) for c in pool.calls] == [2, 2, 1]  # max_batch_size 2
        assert all(0 < c["deadline_ms"] <= 5000 for c in pool.calls)
        assert backend.resolve_model(None, "en", "de") == "nllb-de"  # what the answer named
        assert backend.supports("en", "de-AT") and backend.supports(None, "zh-CN")
        assert not backend.supports("en", "ja")
        assert backend.cache_identity(None, "en", "de") == "pool|abc|None"
    finally:
        await backend.aclose()


async def test_a_batch_whose_deadline_passes_while_it_waits_is_given_up() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            return httpx.Response(200, json=INFO)
        await asyncio.sleep(600)  # far past the guard below
        return httpx.Response(500)

    backend = PoolTranslator(pool_config(httpx.MockTransport(slow), pool_url="http://pool"))
    await backend.start()
    await backend.wait_ready(60)
    try:
        with pytest.raises(BackendTimeout, match="deadline"):
            async with asyncio.timeout(60):
                await backend.run(due_in(["Hi."], 0.2))
        assert backend.ready
    finally:
        await backend.aclose()


async def test_a_batch_past_its_deadline_is_not_sent() -> None:
    backend = PoolTranslator(pool_config(pool_url="http://127.0.0.1:9"))
    backend.ready = True
    try:
        with pytest.raises(Expired):
            await backend.run(due_in(["Hello."], 0.0))
        # Sent: the port refuses, and the backend says why it is not ready.
        with pytest.raises(BackendUnavailable, match="unreachable"):
            await backend.run(due_in(["Hello."], 5.0))
        assert not backend.ready and "unreachable" in (backend.reason or "")
    finally:
        await backend.aclose()


async def test_without_a_url_the_pool_backend_is_never_ready() -> None:
    backend = PoolTranslator(pool_config())
    assert not backend.ready and "THINKTRANS_POOL_URL" in (backend.reason or "")
    with pytest.raises(BackendUnavailable):
        await backend.translate(["Hello."], source="en", target="de")
    await backend.aclose()


def test_the_pool_url_must_be_an_http_url() -> None:
    from service.exceptions import ConfigError
    from service.settings import load_settings

    with pytest.raises(ConfigError, match="THINKTRANS_POOL_URL"):
        load_settings(pool_url="thinktrans-pool:8000")
    assert load_settings(pool_url="https://pool:8000").pool_url == "https://pool:8000"


def test_calls_are_cut_at_the_pool_limits() -> None:
    assert _parts(["a"] * 5, 2, 100) == [["a", "a"], ["a", "a"], ["a"]]
    assert _parts(["aaa", "bb", "c"], 10, 4) == [["aaa"], ["bb", "c"]]
    assert _parts(["x" * 10], 10, 4) == [["x" * 10]]


async def test_the_backend_cuts_long_texts_and_calls_to_the_pools_limits() -> None:
    """A text longer than the pool's max_text_chars goes as its sentences, joined again;
    a batch over max_call_chars as several calls; both limits as /v1/info says them."""
    limits = {**INFO, "max_batch_size": 64, "max_text_chars": 50, "max_call_chars": 120}

    async def pool(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            return httpx.Response(200, json=limits)
        body = json.loads(request.content)
        calls.append(body["texts"])
        return httpx.Response(200, json={"translations": [f"<{t}>" for t in body["texts"]],
                                         "identity": "abc"})

    calls: list[list[str]] = []
    backend = PoolTranslator(pool_config(httpx.MockTransport(pool), pool_url="http://pool"))
    await backend.start()
    assert await backend.wait_ready(5)
    try:
        long = "The first one reads the file. The second one writes it. And a third one. "
        out = await backend.run(due_in([" " + long, "Short.", "x" * 45, "y" * 45], 5.0))
        assert out == [" <The first one reads the file.> <The second one writes it. And a "
                       "third one.> ", "<Short.>", f"<{'x' * 45}>", f"<{'y' * 45}>"]
        assert all(len(t) <= 50 for texts in calls for t in texts), calls
        assert all(sum(map(len, texts)) <= 120 for texts in calls), calls
        assert len(calls) == 2, calls
        calls.clear()  # no space between the parts of a Chinese text
        half = "One two three four five six seven eight nine ten."  # 50 characters
        assert await backend.run(Job([f"{half} {half}"], "en", "zh")) == [f"<{half}><{half}>"]
    finally:
        await backend.aclose()


async def test_the_backend_sends_each_texts_spans_within_the_pools_limits() -> None:
    """Spans go per text as [start, end, kind, out], and only in calls that have some; a
    text cut to max_text_chars is never cut inside a span, each part with its own spans; a
    batch is cut so that every body, spans counted, stays within max_call_bytes; how the
    pool kept them is counted in info()."""
    limits = {**INFO, "max_batch_size": 64, "max_text_chars": 60, "max_call_chars": 10_000,
              "max_call_bytes": 700}
    bodies: list[bytes] = []

    async def pool(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            return httpx.Response(200, json=limits)
        bodies.append(request.content)
        body = json.loads(request.content)
        out = []
        for i, text in enumerate(body["texts"]):  # every span's out, the rest upper-cased
            at, parts = 0, []
            for start, end, _, keep in (body.get("spans") or [[]] * len(body["texts"]))[i]:
                parts += [text[at:start].upper(), keep]
                at = end
            out.append("".join([*parts, text[at:].upper()]))
        kept = {"masked": 1, "fallback": sum(map(bool, body["spans"])) - 1} if "spans" in body \
            else None
        return httpx.Response(200, json={"translations": out, "identity": "abc",
                                         **({"spans": kept} if kept else {})})

    finder = SpanFinder()
    long = ("Open src/app.py first. Then call parse_args() on it. Check config.yaml "
            "and https://example.com/some/long/path/here before v1.2.3 ships.")
    texts = [long, "Plain words only.", *[f"Then check file_{i}.py and run_{i}()." for i in
                                          range(8)]]
    protected: list[Protected | None] = [finder.find(text) for text in texts]
    assert protected[1] is None and all(p is not None for i, p in enumerate(protected) if i != 1)
    backend = PoolTranslator(pool_config(httpx.MockTransport(pool), pool_url="http://pool"))
    await backend.start()
    assert await backend.wait_ready(5)
    try:
        out = await backend.run(Job(texts, "en", "de", protected=protected))
        plain = await backend.run(Job(["Nothing here."], "en", "de"))
    finally:
        await backend.aclose()
    for text, spans, translated in zip(texts, protected, out, strict=True):
        assert spans is None or spans.missing(translated) == [], translated
        assert translated.lower() == text.lower()
    assert plain == ["NOTHING HERE."]
    assert len(bodies) >= 3 and all(len(b) <= 700 for b in bodies), [len(b) for b in bodies]
    calls = [json.loads(b) for b in bodies]
    assert "spans" not in calls[-1]  # a call without any says nothing of them
    for call in calls[:-1]:
        for text, spans in zip(call["texts"], call["spans"], strict=True):
            assert len(text) <= 60
            assert all(text[start:end] == keep for start, end, _, keep in spans), (text, spans)
    sent = [text for call in calls for text in call["texts"]]
    assert "src/app.py" in "".join(sent) and not any(t.endswith("src/") for t in sent)
    with_spans = [call for call in calls if "spans" in call]
    texts_with_spans = sum(sum(map(bool, call["spans"])) for call in with_spans)
    assert backend.info()["spans"] == {"masked": len(with_spans),
                                       "fallback": texts_with_spans - len(with_spans)}


async def test_the_backend_takes_the_pools_word_on_checking_its_output() -> None:
    """A pool serving a random-weight test checkpoint says so (checked_output false); the
    sidecar's output-language check is then off for it, as for `local` on that checkpoint."""
    for said, checked in ((False, False), (True, True), (None, True)):
        info = {k: v for k, v in INFO.items()}
        if said is not None:
            info["checked_output"] = said

        async def pool(request: httpx.Request, info: dict[str, Any] = info) -> httpx.Response:
            return httpx.Response(200, json=info)

        backend = PoolTranslator(pool_config(httpx.MockTransport(pool), pool_url="http://pool"))
        await backend.start()
        try:
            assert await backend.wait_ready(5)
            assert backend.capabilities.checked_output is checked, said
        finally:
            await backend.aclose()


async def test_a_sidecar_logs_no_line_per_pool_call(capfd: pytest.CaptureFixture[str]) -> None:
    """httpx logs each request at info: under the service's logging, a sidecar's pool
    backend would write one line per batch. Quiet below warning, as JSON lines all the same."""
    import logging

    from service.ops.logs import configure

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("info", log_text=False, transformers=False)
        backend = await scripted(ScriptedPool())
        try:
            assert await backend.run(due_in(["Hi."], 5.0)) == ["de:Hi."]
        finally:
            await backend.aclose()
        logging.getLogger("httpx").warning("a warning still shows")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line]
    assert [line["msg"] for line in lines if line["logger"] == "httpx"] == [
        "a warning still shows"], lines


async def test_a_preview_goes_with_its_previous_previews_within_the_pools_limits() -> None:
    """``preview`` and ``previous`` go only in a preview's calls, each previous cut to
    max_text_chars and at most max_call_chars of them a call; a text cut into parts goes
    without its previous; a final batch's call carries neither."""
    limits = {**INFO, "max_batch_size": 64, "max_text_chars": 40, "max_call_chars": 70}
    bodies: list[dict[str, Any]] = []

    async def pool(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            return httpx.Response(200, json=limits)
        body = json.loads(request.content)
        bodies.append(body)
        return httpx.Response(200, json={"translations": body["texts"], "identity": "abc"})

    backend = PoolTranslator(pool_config(httpx.MockTransport(pool), pool_url="http://pool"))
    await backend.start()
    assert await backend.wait_ready(5)
    long = "The first one reads the file. The second one writes it all again."
    try:
        await backend.run(Job(["So the user", "Then I", long], "en", "de", preview=True,
                              previous=["x" * 50, "Dann", "lang"]))
        await backend.run(Job(["So the user"], "en", "de", previous=["Also"]))
    finally:
        await backend.aclose()
    *previews, final = bodies
    assert all(body["preview"] is True for body in previews)
    sent = {t: p for body in previews for t, p in zip(body["texts"], body["previous"] or
                                                       [None] * len(body["texts"]),
                                                       strict=True)}
    assert sent["So the user"] == "x" * 40 and sent["Then I"] == "Dann"
    assert [p for t, p in sent.items() if t not in ("So the user", "Then I")] == [None, None]
    assert all(sum(len(p or "") for p in body["previous"] or []) <= 70 for body in previews)
    assert "preview" not in final and "previous" not in final
