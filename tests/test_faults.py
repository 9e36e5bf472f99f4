"""Faults through the whole app: a backend that raises, hangs, is slow, is rate limited,
out of quota or down, answers garbage or the wrong language; a reader that drops and
resumes, one that never reads, a writer that never closes; shutdown with open streams.

In every case the contract holds: the originals survive, in order, once each; the statuses
say what happened; and the service stays healthy afterwards (/healthz is 200 and a normal
request works).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx
import pytest

from models.base import Translator
from models.passthrough import PassthroughTranslator
from tests.conftest import (
    PROBLEM,
    InThread,
    Running,
    check_stream,
    deltas,
    poll,
    post_chunks,
    read_until,
    segments,
    served,
)
from tests.conftest import app_with as _app_with
from tests.fakes import FakeTranslator
from tests.fakes_remote import FakeChat, FakeDeepL

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("Let me check the weather in Berlin first. Then I will compare it with Munich. "
        "The user wants a short answer")  # the last sentence has no end: close flushes it
SSE = {"Accept": "text/event-stream"}
# Long enough for a hang to fail a test, never what it measures.
HANG_S = 60.0


# -- helpers ---------------------------------------------------------------------------------


def app_with(translator: Translator | None = None, **overrides: Any) -> Any:
    """The shared in-process app; these tests read German by default."""
    overrides.setdefault("default_locale", "de")
    return _app_with(translator, **overrides)


def final_statuses(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each segment's last word: its segment event, or the update that followed it."""
    final = {s["index"]: s for s in segments(events)}
    for e in events:
        if e["type"] == "update":
            final[e["data"]["index"]] = {**final[e["data"]["index"]], **e["data"]}
    return final


async def assert_healthy(client: httpx.AsyncClient) -> None:
    """Alive, and a normal request (one-shot and a stream, on passthrough) works."""
    assert (await client.get("/healthz")).status_code == 200
    r = await client.post("/v1/translate", json={
        "texts": ["Everything is fine again now."], "target": "de", "backend": "passthrough"})
    assert r.status_code == 200, r.text
    [seg] = r.json()["results"][0]["segments"]
    assert (seg["status"], seg["backend"]) == ("translated", "passthrough")
    sid = f"after-{time.monotonic_ns()}"
    r = await client.post("/v1/streams", json={"stream_id": sid, "backend": "passthrough"})
    assert r.status_code == 201, r.text
    await post_chunks(client, sid, deltas("All good here. Really."))
    assert (await client.post(f"/v1/streams/{sid}/close")).status_code == 200
    check_stream(await read_until(client, sid), "All good here. Really.")


# -- the backend fails ----------------------------------------------------------------------


async def test_a_backend_that_raises_leaves_the_originals_with_status_error() -> None:
    fake = FakeTranslator(answers=deque(RuntimeError("boom") for _ in range(3)))
    # However many batches the stream's segments take, the breaker must not open here.
    async with app_with(fake, deadline_ms=5000, breaker_failures=50) as run:
        c = run.client
        await post_chunks(c, "raise", deltas(TEXT))
        assert (await c.post("/v1/streams/raise/close")).status_code == 200
        events = await read_until(c, "raise")
        check_stream(events, TEXT)
        for seg in segments(events):
            assert seg["status"] == "error", seg
            assert "RuntimeError" in seg["error"] and "fake" in seg["error"], seg
        fake.answers.clear()
        r = await c.post("/v1/translate", json={"texts": ["A second try goes through."]})
        [seg] = r.json()["results"][0]["segments"]
        assert (seg["status"], seg["backend"]) == ("translated", "fake")  # it recovers
        assert await run.metric("thinktrans_backend_errors_total", backend="fake",
                                kind="backend-error") >= 1
        await assert_healthy(c)


async def test_a_hung_backend_meets_the_deadline_then_backend_timeout_s() -> None:
    fake = FakeTranslator(gate=asyncio.Event())  # never opens while the test runs
    async with app_with(fake, deadline_ms=200, backend_timeout_s=4.0) as run:
        c = run.client
        r = await post_chunks(c, "hang", deltas(TEXT, 40))
        assert r.status_code == 200
        # A chunk POST never waits for translation: it is answered before the backend's
        # timeout gives up on the batch (no update yet).
        assert not [e for e in await poll(c, "hang") if e["type"] == "update"]
        await c.post("/v1/streams/hang/close")
        events = await read_until(c, "hang", timeout_s=HANG_S)
        check_stream(events, TEXT)
        assert {s["status"] for s in segments(events)} == {"deadline"}
        for seg in segments(events):
            assert seg["latency_ms"] >= 150, seg  # not before its deadline
        for update in final_statuses(events).values():
            assert update["status"] == "error", update
            assert "took over 4 s" in update["error"], update
        # One-shot: the original comes back at the deadline, the late answer is dropped.
        r = await c.post("/v1/translate", json={"texts": ["Is it still hanging there?"]})
        [seg] = r.json()["results"][0]["segments"]
        assert seg["status"] == "deadline" and seg["text"] == "Is it still hanging there?"
        assert seg["latency_ms"] >= 150, seg
        await assert_healthy(c)


async def test_slow_answers_go_out_at_the_deadline_and_follow_as_updates() -> None:
    fake = FakeTranslator(delay_s=0.5)
    async with app_with(fake, deadline_ms=150, max_batch_size=2) as run:
        c = run.client
        await post_chunks(c, "slow", deltas(TEXT))
        await c.post("/v1/streams/slow/close")
        events = await read_until(c, "slow", timeout_s=HANG_S)
        check_stream(events, TEXT)
        assert {s["status"] for s in segments(events)} == {"deadline"}
        for index, final in final_statuses(events).items():
            assert final["status"] == "translated", final
            original = segments(events)[index]["original"]
            assert final["text"].startswith("<de>") and original.strip() in final["text"]
        await assert_healthy(c)


# -- vendor doubles -----------------------------------------------------------------------------


def deepl_settings(server: FakeDeepL, **overrides: Any) -> dict[str, Any]:
    return {"backend": "deepl", "deepl_api_key": "k", "deepl_server_url": server.origin,
            "check_output_language": False, "default_locale": "de", **overrides}


async def _deepl_up(run: Running, timeout_s: float = 5.0) -> None:
    """Wait for the start-time check, so that the fault hits a backend that was up."""
    await run.runtime.backends["deepl"].wait_ready(timeout_s)
    assert run.runtime.backends["deepl"].ready


@pytest.mark.parametrize(
    ("mode", "words"),
    [("429", ["rate limiting", "429"]), ("500", ["HTTP 500"])],
    ids=["rate-limited", "server-error"],
)
async def test_deepl_failing_gives_status_error_on_a_stream(
    deepl_server: FakeDeepL, mode: str, words: list[str]
) -> None:
    deepl_server.reset()
    async with app_with(**deepl_settings(deepl_server, deadline_ms=300)) as run:
        await _deepl_up(run)
        run.runtime.backends["deepl"].outage_recheck_s = 0.2
        deepl_server.mode = mode
        c = run.client
        await post_chunks(c, "vendor", deltas(TEXT))
        await c.post("/v1/streams/vendor/close")
        events = await read_until(c, "vendor", timeout_s=HANG_S)
        check_stream(events, TEXT)
        for final in final_statuses(events).values():
            assert final["status"] == "error", final
            assert all(word in final["error"] for word in words), final
        await assert_healthy(c)
        deepl_server.mode = "ok"  # the vendor recovers, and so does the backend
        give_up = time.monotonic() + HANG_S
        while (await c.get("/readyz")).status_code != 200:
            assert time.monotonic() < give_up, "deepl did not come back"
            await asyncio.sleep(0.1)
        r = await c.post("/v1/translate", json={"texts": ["We are back in business."]})
        assert r.json()["results"][0]["segments"][0]["backend"] == "deepl"


async def test_a_spent_deepl_quota_falls_through_the_chain_and_says_why(
    deepl_server: FakeDeepL,
) -> None:
    deepl_server.reset()
    settings = deepl_settings(deepl_server, backend="deepl,passthrough", deadline_ms=5000)
    async with app_with(**settings) as run:
        await _deepl_up(run)
        deepl_server.mode = "456"
        c = run.client
        await post_chunks(c, "quota", deltas(TEXT))
        await c.post("/v1/streams/quota/close")
        events = await read_until(c, "quota")
        check_stream(events, TEXT)
        assert {(s["status"], s["backend"]) for s in segments(events)} == {
            ("translated", "passthrough")}
        ready = await c.get("/readyz")  # degraded: the chain still serves
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert "456" in ready.json()["backends"]["deepl"]["reason"]
        calls = len(deepl_server.translate_requests)
        r = await c.post("/v1/translate", json={"texts": ["One more sentence to go."]})
        assert r.json()["results"][0]["segments"][0]["backend"] == "passthrough"
        assert len(deepl_server.translate_requests) == calls, "a spent quota is not retried"
        await assert_healthy(c)


async def test_llm_garbage_gives_status_error_and_the_service_stays_up(
    chat_server: FakeChat,
) -> None:
    chat_server.reset()
    chat_server.mode = "malformed"
    settings = {"backend": "llm", "llm_base_url": f"{chat_server.origin}/v1",
                "llm_model": "m", "deadline_ms": 5000}
    async with app_with(**settings) as run:
        c = run.client
        await post_chunks(c, "garbage", deltas(TEXT))
        await c.post("/v1/streams/garbage/close")
        events = await read_until(c, "garbage")
        check_stream(events, TEXT)
        for seg in segments(events):
            assert seg["status"] == "error" and "malformed" in seg["error"], seg
        await assert_healthy(c)


async def test_llm_output_in_the_wrong_language_goes_down_the_chain(chat_server: FakeChat
                                                                   ) -> None:
    chat_server.reset()  # "good" answers echo the English text: not German
    base = {"llm_base_url": f"{chat_server.origin}/v1", "llm_model": "m", "deadline_ms": 5000}
    async with app_with(backend="llm,passthrough", **base) as run:
        c = run.client
        await post_chunks(c, "lang", deltas(TEXT))
        await c.post("/v1/streams/lang/close")
        events = await read_until(c, "lang")
        check_stream(events, TEXT)
        assert {s["backend"] for s in segments(events)} == {"passthrough"}
    async with app_with(backend="llm", **base) as run:
        c = run.client
        await post_chunks(c, "lang", deltas(TEXT))
        await c.post("/v1/streams/lang/close")
        events = await read_until(c, "lang")
        check_stream(events, TEXT)
        for seg in segments(events):
            assert seg["status"] == "error" and "not de" in seg["error"], seg
        await assert_healthy(c)


# -- readers and writers that misbehave -----------------------------------------------------------


async def test_a_reader_that_never_reads_gets_410_and_the_service_stays_up() -> None:
    async with app_with(max_events_retained=16) as run:
        c = run.client
        text = "".join(f"Sentence number {i} is here. " for i in range(40))
        await post_chunks(c, "deaf", deltas(text, 50))
        await c.post("/v1/streams/deaf/close")
        stream = run.app.state.runtime.streams.streams["deaf"]
        for _ in range(100):
            if stream.ended:
                break
            await asyncio.sleep(0.02)
        assert stream.ended and len(stream.log.events) == 16  # retained: bounded
        late = await c.get("/v1/streams/deaf/events")
        assert late.status_code == 410, late.text
        assert late.headers["content-type"].startswith(PROBLEM)
        first = stream.log.events[0][0]
        assert f"read from {first - 1}" in late.json()["detail"]
        assert "MAX_EVENTS_RETAINED" in late.json()["detail"]
        assert (await c.get("/v1/streams/deaf/events", headers=SSE)).status_code == 410
        rest = await c.get("/v1/streams/deaf/events", params={"after": first - 1})
        assert [e["id"] for e in rest.json()["events"]] == list(range(first, first + 16))
        assert rest.json()["events"][-1]["type"] == "end"
        await assert_healthy(c)


async def test_a_stream_that_is_never_closed_expires_and_releases_its_reader() -> None:
    async with app_with(stream_idle_expire_s=0.6, flush_idle_ms=100) as run:
        c = run.client
        await post_chunks(c, "abandoned", deltas("Thinking about it. And then I stop mid"))
        assert await run.metric("thinktrans_open_streams") == 1
        # The stream expires: its reader is let go (it would otherwise wait for ever).
        r = await asyncio.wait_for(c.get("/v1/streams/abandoned/events", headers=SSE), HANG_S)
        originals = [json.loads(line[6:])["original"] for line in r.text.splitlines()
                     if line.startswith("data: ")]
        assert originals == ["Thinking about it. ", "And then I stop mid"]  # idle flush
        gone = await c.get("/v1/streams/abandoned/events")
        assert gone.status_code == 404 and "expired" in gone.json()["detail"]
        assert await run.metric("thinktrans_open_streams") == 0
        await assert_healthy(c)


async def test_a_large_one_shot_request_does_not_hold_streams_past_their_deadline() -> None:
    """API.md, Timing: a segment's result is out by ready + deadline_ms, whatever else the
    service is doing. One one-shot request within the default limits (250 texts, under
    1 MiB) is ~10,000 segments to cut and detect; that work must not stall the event loop
    that fires every stream's deadline timers."""
    from service.tools.corpus import builtin_corpus

    corpus = [item.text for item in builtin_corpus()]
    texts = [" ".join(corpus[(i + k) % len(corpus)] for k in range(7)) for i in range(250)]
    fake = FakeTranslator(gate=asyncio.Event())  # the stream's segment waits for its deadline
    async with app_with(fake, deadline_ms=200) as run:
        c = run.client
        await post_chunks(c, "victim", [(0, "Let me check the weather in Berlin first. ")])
        await asyncio.wait_for(fake.started.wait(), HANG_S)  # its translation is under way
        started = time.monotonic()
        big = asyncio.create_task(c.post("/v1/translate", json={
            "texts": texts, "target": "de", "backend": "passthrough"}))
        r = await c.get("/v1/streams/victim/events", params={"wait_ms": 60_000})
        [seg] = segments(r.json()["events"])
        assert seg["status"] == "deadline"
        answer = await big  # 200, or a problem: too many segments for the queue
        big_ms = (time.monotonic() - started) * 1000.0
        assert answer.status_code in (200, 413, 503), answer.text
        # Late by no more than a loop turn, or (on a machine slow enough that turns are
        # long too) by less than half the time the request's own work took: a loop held
        # for the whole work would make it as late as that work was long.
        late_ms = seg["latency_ms"] - 200
        assert late_ms < 300 or late_ms < big_ms / 2, (
            f"the deadline segment went out {late_ms:.0f} ms late; the request took "
            f"{big_ms:.0f} ms")
        await assert_healthy(c)


async def _sse_read(client: httpx.AsyncClient, sid: str, last_id: int | None, limit: int
                    ) -> list[dict[str, Any]]:
    """Read up to ``limit`` events over SSE, then drop the connection."""
    headers = dict(SSE)
    if last_id is not None:
        headers["Last-Event-ID"] = str(last_id)
    got: list[dict[str, Any]] = []
    fields: dict[str, str] = {}
    async with client.stream("GET", f"/v1/streams/{sid}/events", headers=headers) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if "data" in fields:
                got.append({"id": int(fields["id"]), "type": fields["event"],
                            "data": json.loads(fields["data"])})
            fields = {}
            if len(got) >= limit or (got and got[-1]["type"] == "end"):
                break  # the reader goes away mid-stream
    return got


async def test_an_sse_reader_that_drops_and_resumes_loses_and_repeats_nothing() -> None:
    slow = FakeTranslator(delay_s=0.25)  # some segments go out late, with updates after
    parts = [f"Part {i} of the plan is written down here. " for i in range(12)]
    text = "".join(parts) + "Last words"
    with InThread({"fake": slow, "passthrough": PassthroughTranslator()}, backend="fake",
                 default_locale="de", deadline_ms=150, max_batch_size=3) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            assert (await c.post("/v1/streams", json={"stream_id": "drop:1"})).status_code == 201
            seq = 0

            async def writer() -> None:
                nonlocal seq
                for part in parts:
                    for _, delta in deltas(part, 9):
                        r = await post_chunks(c, "drop:1", [(seq, delta)])
                        assert r.json() == {"accepted_through": seq}
                        seq += 1
                    await asyncio.sleep(0.05)
                await post_chunks(c, "drop:1", [(seq, "Last words")])
                assert (await c.post("/v1/streams/drop:1/close")).status_code == 200

            writing = asyncio.create_task(writer())
            got: list[dict[str, Any]] = []
            reconnects = 0
            while not got or got[-1]["type"] != "end":
                last = got[-1]["id"] if got else None
                got += await asyncio.wait_for(_sse_read(c, "drop:1", last, 1 + reconnects % 3),
                                              10)
                reconnects += 1
                assert reconnects < 500
            await writing
            check_stream(got, text)
            assert reconnects > 5
            assert any(e["type"] == "update" for e in got), "some answers came late"
            polled = await read_until(c, "drop:1")
            assert got == polled  # SSE resumed = long-poll from the start
            assert (await c.get("/healthz")).status_code == 200


# -- shutdown with open streams (a real process, SIGTERM) ---------------------------------------


class _SSEReader(threading.Thread):
    """Reads one stream's SSE until the server ends it; keeps every event."""

    def __init__(self, url: str, sid: str) -> None:
        super().__init__(daemon=True)
        self.url, self.sid = url, sid
        self.events: list[dict[str, Any]] = []
        self.connected = threading.Event()

    def run(self) -> None:
        fields: dict[str, str] = {}
        try:
            with httpx.stream("GET", f"{self.url}/v1/streams/{self.sid}/events", headers=SSE,
                              timeout=60) as r:
                self.connected.set()
                for line in r.iter_lines():
                    if line.startswith(":"):
                        continue
                    if line:
                        name, _, value = line.partition(": ")
                        fields[name] = value
                        continue
                    if "data" in fields:
                        self.events.append({"id": int(fields["id"]), "type": fields["event"],
                                            "data": json.loads(fields["data"])})
                    fields = {}
        except httpx.HTTPError:
            pass  # the server went away: what was read is what counts
        finally:
            self.connected.set()


def test_sigterm_flushes_every_open_stream_to_its_readers_and_exits() -> None:
    with served(THINKTRANS_DEFAULT_LOCALE="de", THINKTRANS_FLUSH_IDLE_MS="60000",
                THINKTRANS_SHUTDOWN_GRACE_S="3") as server:
        url = server.url
        texts = {"t:1": TEXT, "t:2": "Only half a sentence so", "t:3": TEXT + " and more"}
        for sid, text in texts.items():
            r = httpx.post(f"{url}/v1/streams/{sid}/chunks",
                           json={"chunks": [{"seq": s, "text": t} for s, t in deltas(text)]})
            assert r.status_code == 200
        # t:4 holds seq 2 past a gap at seq 1 that never comes: only seq 0 can go out.
        r = httpx.post(f"{url}/v1/streams/t:4/chunks",
                       json={"chunks": [{"seq": 0, "text": "Before the gap. "},
                                        {"seq": 2, "text": "after it"}]})
        assert r.json() == {"accepted_through": 0}
        readers = {sid: _SSEReader(url, sid) for sid in ("t:1", "t:2", "t:4")}  # t:3: none
        for reader in readers.values():
            reader.start()
            assert reader.connected.wait(HANG_S)
        time.sleep(0.5)  # complete sentences are out; the unterminated rest waits
        # The open streams hold no process past its grace: it exits, as its log says, once
        # they are drained (THINKTRANS_FLUSH_IDLE_MS would flush them a minute later).
        server.terminate(timeout_s=40)  # under the minute an idle flush would take
        for reader in readers.values():
            reader.join(HANG_S)
            assert not reader.is_alive(), "a reader was left hanging"
        check_stream(readers["t:1"].events, TEXT)
        check_stream(readers["t:2"].events, texts["t:2"])
        check_stream(readers["t:4"].events, "Before the gap. ")
        assert '"streams drained"' in server.log()


def test_sigterm_with_a_hung_backend_still_gives_readers_every_original_and_an_end(
    deepl_server: FakeDeepL,
) -> None:
    """A backend that never answers must not cost a reader its originals at shutdown.

    deadline_ms (5 s) is longer than shutdown_grace_s (1 s): when the grace runs out the
    segments have not reached their deadline yet. They must still go out with their
    originals (status error or deadline, an update for each deadline one), then `end`.
    """
    deepl_server.reset()
    try:
        with served(THINKTRANS_BACKEND="deepl", THINKTRANS_DEEPL_API_KEY="k",
                    THINKTRANS_DEEPL_SERVER_URL=deepl_server.origin,
                    THINKTRANS_CHECK_OUTPUT_LANGUAGE="false", THINKTRANS_DEFAULT_LOCALE="de",
                    THINKTRANS_DEADLINE_MS="5000", THINKTRANS_SHUTDOWN_GRACE_S="1") as server:
            # Slower than the process's timeout below: an exit that waited for it fails.
            deepl_server.mode, deepl_server.slow_s = "slow", 2 * HANG_S
            r = httpx.post(f"{server.url}/v1/streams/h:1/chunks",
                           json={"chunks": [{"seq": s, "text": t} for s, t in deltas(TEXT)]})
            assert r.status_code == 200
            reader = _SSEReader(server.url, "h:1")
            reader.start()
            assert reader.connected.wait(HANG_S)
            time.sleep(0.5)
            server.terminate(timeout_s=HANG_S)  # raises when it did not exit
            reader.join(HANG_S)
        check_stream(reader.events, TEXT)
    finally:
        deepl_server.reset()
