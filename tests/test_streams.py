"""Streams over HTTP: seqs, segments in order, deadlines and updates, SSE and long-poll.

The invariant behind everything (API.md): for a stream, the ``original`` fields of its
``segment`` events in index order, joined, equal its chunks in seq order, joined, byte
for byte, whatever the chunking, the interleaving with other streams, the retries and
the out-of-order delivery. A property test drives that through the in-process client;
the rest pin the contract's timing, limits and error shapes one case at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.base import Job
from models.errors import BackendUnavailable
from service.exceptions import EventsGone
from service.stream.retention import GONE_REMEMBERED, Retention
from tests.conftest import (
    InThread,
    app_with,
    assert_problem,
    check_stream,
    parse_sse,
    poll,
    post_chunks,
    read_until,
    segments,
    sse_events,
)
from tests.conftest import served as serve_cli
from tests.fakes import Call, FakeTranslator

ROOT = Path(__file__).resolve().parent.parent

# -- helpers -------------------------------------------------------------------------------


# -- the invariant, as a property ----------------------------------------------------------

FRAGMENTS = [
    "Let me think about this. ", "The user wants 3 apples. ", "Hmm, ", "OK. ", "OK.",
    "First, check the file.\n", "Version 1.2.3 is out! ", "e.g. this one. ", "Is it 42? ",
    "我们来看看。", "这是一个问题！", "首先，确定整个 hiking旅程所用的总时间。",
    "用户想要3个苹果。 ",
    "これは日本語です。", "ちょっと待って。", "テストを書きます！",
    "```python\n", "x = compute(1)\n", "print(x)\n", "```\n", "~~~\n", "    indented()\n",
    "```js\nlet a = 1;\n```\n", "Here is code:\n```\nfoo()\n\nbar()\n```\nThen prose follows. ",
    "\n", "\n\n", "  ", "\t", "42 + 17 = 59", "3.14", "https://example.com/a.b ", "…",
    "Das ist ein Satz. ", "¿Qué pasa? ", "$x^2$ ", "`code span` here. ",
]
_ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=6)
TEXTS = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.sampled_from(FRAGMENTS), _ANY_TEXT),
                 max_size=16).map("".join)
STREAM_IDS = ["s0", "sess-1:msg.2", "A_b.c:D-e", "x" * 128]


@dataclass
class StreamPlan:
    sid: str
    text: str
    chunks: list[str]  # by seq
    requests: list[list[int]]  # the seqs of each POST, in the order they go out
    target: str | None  # None: opened by its first chunk, with the default target


@st.composite
def stream_plans(draw: st.DrawFn, sid: str) -> StreamPlan:
    text = draw(TEXTS)
    sizes = draw(st.lists(st.one_of(st.integers(1, 6), st.integers(1, 6), st.integers(7, 80),
                                    st.just(0)), min_size=1, max_size=30))
    if not any(sizes):
        sizes = [1]
    chunks: list[str] = []
    pos = 0
    while pos < len(text):
        n = sizes[len(chunks) % len(sizes)]
        chunks.append(text[pos:pos + n])
        pos += n
    if not chunks:
        chunks = [""]
    # Out of order within windows (each shuffled block stays under max_gap held chunks).
    window = draw(st.integers(1, 4))
    order: list[int] = []
    for start in range(0, len(chunks), window):
        order += draw(st.permutations(range(start, min(start + window, len(chunks)))))
    # Retries: re-post a seq that already went out, with the same text.
    for at, pick in draw(st.lists(st.tuples(st.integers(0, 999), st.integers(0, 999)),
                                  max_size=4)):
        p = 1 + at % len(order)
        order.insert(p, order[pick % p])
    sizes_per_post = draw(st.lists(st.integers(1, 4), min_size=1, max_size=8))
    requests = []
    i = 0
    while i < len(order):
        n = sizes_per_post[len(requests) % len(sizes_per_post)]
        requests.append(order[i:i + n])
        i += n
    target = draw(st.sampled_from([None, "en", "zh-CN", "ja", "de"]))
    return StreamPlan(sid, text, chunks, requests, target)


@dataclass
class Scenario:
    plans: list[StreamPlan]
    order: list[int]  # which stream posts next (sequential mode)
    concurrent: bool  # each stream posts from its own task, all at once
    pauses: set[int]  # turns before which the client goes quiet past flush_idle_ms
    slow: bool  # the backend misses most deadlines: `deadline` segments, then updates


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(2, 4))
    plans = [draw(stream_plans(STREAM_IDS[i])) for i in range(n)]
    turns = [i for i, plan in enumerate(plans) for _ in plan.requests]
    return Scenario(plans, list(draw(st.permutations(turns))), draw(st.booleans()),
                    set(draw(st.lists(st.integers(0, len(turns)), max_size=2))),
                    draw(st.booleans()))


class SeqModel:
    """What accepted_through must be: the end of the contiguous prefix seen so far."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.next = 0

    def post(self, seqs: list[int]) -> int:
        self.seen.update(seqs)
        while self.next in self.seen:
            self.next += 1
        return self.next - 1


async def _run_scenario(sc: Scenario) -> None:
    plans = sc.plans
    # A small size bound and idle flush, so that size cuts and idle flushes happen too.
    knobs: dict[str, Any] = {"flush_idle_ms": 20, "max_gap": 8, "max_segment_chars": 48}
    if sc.slow:
        knobs["deadline_ms"] = 20
    fake = FakeTranslator(delay_s=0.05) if sc.slow else None
    async with app_with(fake, default_locale="en", **knobs) as run:
        client = run.client
        for plan in plans:
            if plan.target is not None:
                r = await client.post("/v1/streams",
                                      json={"stream_id": plan.sid, "target": plan.target})
                assert r.status_code == 201, r.text
        models = [SeqModel() for _ in plans]

        async def send(i: int, seqs: list[int]) -> None:
            plan = plans[i]
            r = await post_chunks(client, plan.sid, [(s, plan.chunks[s]) for s in seqs])
            assert r.status_code == 200, r.text
            assert r.json() == {"accepted_through": models[i].post(seqs)}

        if sc.concurrent:
            async def worker(i: int) -> None:
                for seqs in plans[i].requests:
                    await send(i, seqs)

            await asyncio.gather(*(worker(i) for i in range(len(plans))))
        else:
            pending = [iter(plan.requests) for plan in plans]
            for turn, i in enumerate(sc.order):
                if turn in sc.pauses:
                    await asyncio.sleep(0.05)  # past flush_idle_ms: idle flushes mid-text
                await send(i, next(pending[i]))
        closed = {}
        for plan in plans:
            r = await client.post(f"/v1/streams/{plan.sid}/close")
            assert r.status_code == 200, r.text
            closed[plan.sid] = r.json()["segments"]
        for plan in plans:
            events = await read_until(client, plan.sid)
            check_stream(events, plan.text)
            assert closed[plan.sid] == len(segments(events))
            assert {s["target"] for s in segments(events)} <= {plan.target or "en"}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(scenarios())
def test_any_text_any_chunking_any_interleaving_joins_back_exactly(scenario: Scenario) -> None:
    asyncio.run(_run_scenario(scenario))


# -- deadlines and updates -----------------------------------------------------------------

SLOW = "Let me check the weather first. "
CHINESE = "这是一个中文句子。"
CODE = "```python\nx = 1\n```\n"


async def test_a_missed_deadline_sends_the_original_then_an_update_and_holds_nothing_back(
) -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="zh-CN", deadline_ms=300, flush_idle_ms=50) as run:
        c = run.client
        assert (await post_chunks(c, "d1", [(0, SLOW + CHINESE + CODE)])).status_code == 200
        assert (await c.post("/v1/streams/d1/close")).json() == {"segments": 3}
        first = await read_until(c, "d1", "segment", count=3)
        # The translation is still held: only the deadline let these out at all.
        assert not gate.is_set() and fake.calls[0].texts == [SLOW.strip()]
        seg0, seg1, seg2 = segments(first)
        assert seg0 == {**seg0, "index": 0, "original": SLOW, "text": SLOW, "status": "deadline",
                        "backend": None, "target": "zh-CN", "source_lang": "en"}
        assert seg0["latency_ms"] >= 295  # not before its deadline (its timer's guarantee)
        # The segments after it were ready at once; they went out with it, in order.
        assert (seg1["original"], seg1["status"]) == (CHINESE, "same_language")
        assert (seg2["original"], seg2["status"]) == (CODE, "skipped")
        assert [e["type"] for e in first] == ["segment"] * 3, "no end while an update is owed"
        assert await poll(c, "d1", first[-1]["id"], wait_ms=200) == []

        gate.set()
        rest = await read_until(c, "d1", after=first[-1]["id"])
        assert [e["type"] for e in rest] == ["update", "end"]
        assert rest[0]["data"] == {"index": 0, "text": f"<zh-CN>{SLOW.strip()} ",
                                   "status": "translated", "backend": "fake"}
        check_stream(first + rest, SLOW + CHINESE + CODE)


async def test_a_late_translation_that_fails_is_an_error_update_then_end() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate, answers=deque([BackendUnavailable("quota exceeded")]))
    async with app_with(fake, default_locale="zh-CN", deadline_ms=200) as run:
        c = run.client
        await post_chunks(c, "d3", [(0, SLOW)])
        assert (await c.post("/v1/streams/d3/close")).json() == {"segments": 1}
        first = await read_until(c, "d3", "segment")
        assert segments(first)[0]["status"] == "deadline"
        assert await poll(c, "d3", first[-1]["id"], wait_ms=200) == []  # no end yet
        gate.set()
        rest = await read_until(c, "d3", after=first[-1]["id"])
        assert [e["type"] for e in rest] == ["update", "end"]
        update = rest[0]["data"]
        assert (update["index"], update["status"], update["text"]) == (0, "error", SLOW)
        assert "quota exceeded" in update["error"]


@dataclass
class _HoldsSome(FakeTranslator):
    """Holds only the batches holding ``word`` until its gate opens; answers others at once."""

    word: str = "slow"

    async def run(self, job: Job) -> list[str]:
        self.calls.append(Call(list(job.texts), job.source, job.target))
        if self.gate is not None and any(self.word in t for t in job.texts):
            await self.gate.wait()
        return [f"<{job.target}>{t}" for t in job.texts]


async def test_a_slow_segment_holds_later_translated_ones_only_until_its_deadline() -> None:
    gate = asyncio.Event()
    fake = _HoldsSome(gate=gate, concurrency=2)
    async with app_with(fake, default_locale="de", deadline_ms=400, max_batch_size=1) as run:
        c = run.client
        text = "This one is slow to translate. The next one is quick to do. "
        await post_chunks(c, "d2", [(0, text)])
        await c.post("/v1/streams/d2/close")
        out = await read_until(c, "d2", "segment", count=2)
        a, b = segments(out)
        # The slow one's translation is still held: its deadline let both out, in order.
        assert not gate.is_set()
        assert a["status"] == "deadline" and b["status"] == "translated"
        assert b["text"] == "<de>The next one is quick to do. "
        assert a["latency_ms"] >= 395  # not before its deadline
        # The quick one, translated long before, went out after the slow one, which went
        # out at its deadline: held in order, and no longer (the gate is still shut).
        assert (a["index"], b["index"]) == (0, 1)
        gate.set()
        rest = await read_until(c, "d2", after=out[-1]["id"])
        assert [e["type"] for e in rest] == ["update", "end"]
        check_stream(out + rest, text)


class _EarlyTimerLoop(asyncio.SelectorEventLoop):
    """Fires timers 3 ms early, as uvloop's millisecond, coarse-clock timers do.

    asyncio promises no timer precision; a loop may run a callback a little before its
    time, and uvloop (which `thinktrans serve` uses when installed) regularly does.
    """

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None
                ) -> asyncio.TimerHandle:
        return super().call_at(when - 0.003, callback, *args, context=context)


async def _deadline_holds(streams: int, spacing_s: float) -> list[str]:
    """Open ``streams`` streams, one gated sentence each; return those not out in time."""
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="de", deadline_ms=150) as run:
        c = run.client

        async def one(i: int) -> str | None:
            await asyncio.sleep(i * spacing_s)
            await post_chunks(c, f"t{i}", [(0, "One sentence is here in English. And")])
            events = await poll(c, f"t{i}", wait_ms=1150)  # deadline + 1 s
            return None if events else f"t{i}"

        found = await asyncio.gather(*(one(i) for i in range(streams)))
    return [sid for sid in found if sid is not None]


def test_a_deadline_timer_that_fires_early_still_sends_the_segment_by_its_deadline() -> None:
    with asyncio.Runner(loop_factory=_EarlyTimerLoop) as runner:
        stuck = runner.run(_deadline_holds(1, 0.0))
    assert stuck == [], "the segment waited for its translation, past ready + deadline_ms"


def test_under_uvloop_every_segment_is_out_by_its_deadline() -> None:
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        stuck = runner.run(_deadline_holds(100, 0.003))
    assert stuck == [], f"{len(stuck)} of 100 streams held their segment past the deadline"


# -- SSE and long-poll ---------------------------------------------------------------------

async def test_sse_gives_the_same_events_as_long_poll_and_resumes_after_last_event_id(
) -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="zh-CN", deadline_ms=200) as run:
        c = run.client
        text = SLOW + CHINESE + "Another English sentence. " + CODE
        deltas = [text[i:i + 5] for i in range(0, len(text), 5)]
        await post_chunks(c, "e1", list(enumerate(deltas)))
        assert (await c.post("/v1/streams/e1/close")).json() == {"segments": 4}
        await read_until(c, "e1", "segment", count=3)
        gate.set()
        polled = await read_until(c, "e1")
        assert {"update", "segment", "end"} <= {e["type"] for e in polled}
        check_stream(polled, text)

        sse = "text/event-stream"
        r = await c.get("/v1/streams/e1/events", headers={"Accept": sse})
        assert r.status_code == 200 and r.headers["content-type"].startswith(sse)
        assert parse_sse(r.text) == polled
        for k in (0, 2, len(polled) - 2):
            r = await c.get("/v1/streams/e1/events",
                            headers={"Accept": sse, "Last-Event-ID": str(polled[k]["id"])})
            assert parse_sse(r.text) == polled[k + 1:]
            assert await poll(c, "e1", after=polled[k]["id"]) == polled[k + 1:]
        r = await c.get("/v1/streams/e1/events",
                        headers={"Accept": sse, "Last-Event-ID": str(polled[-1]["id"])})
        assert r.status_code == 200 and parse_sse(r.text) == []


@pytest.mark.parametrize("value", [b"abc", b"1.5", b"\xb2", b"1\xb9"])
async def test_a_last_event_id_that_is_not_an_integer_is_422(value: bytes) -> None:
    """"\xb2" is "²" in latin-1: str.isdigit() says yes, int() says no."""
    async with app_with(default_locale="de") as run:
        transport = httpx.ASGITransport(app=run.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            await post_chunks(c, "h", [(0, "Hello.")])
            r = await c.get("/v1/streams/h/events", headers={"Last-Event-ID": value})
            assert "Last-Event-ID" in assert_problem(r, 422)["detail"]


@pytest.fixture
def served() -> Iterator[str]:
    with InThread(default_locale="zh-CN", flush_idle_ms=5000) as url:
        yield url


async def test_sse_dropped_and_resumed_with_last_event_id_loses_and_repeats_nothing(
    served: str,
) -> None:
    parts = ["First sentence is here. ", "第二句话在这里。", "Third one follows now. ",
             CODE, "Fifth sentence comes here. ", "我们完成了。", "Last words"]
    text = "".join(parts)
    sse = {"Accept": "text/event-stream"}
    async with httpx.AsyncClient(base_url=served, timeout=10) as c:
        r = await c.post("/v1/streams", json={"stream_id": "live:1", "target": "zh-CN"})
        assert r.status_code == 201
        seq = 0

        async def deltas(part: str) -> None:
            nonlocal seq
            for i in range(0, len(part), 4):
                r = await post_chunks(c, "live:1", [(seq, part[i:i + 4])])
                assert r.json() == {"accepted_through": seq}
                seq += 1

        for part in parts[:3]:
            await deltas(part)
        got: list[dict[str, Any]] = []
        async with c.stream("GET", "/v1/streams/live:1/events", headers=sse) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for event in sse_events(r):
                got.append(event)
                if len(got) == 2:
                    break  # the reader goes away mid-stream
        assert [e["id"] for e in got] == [0, 1]
        for part in parts[3:]:
            await deltas(part)  # events pile up while nobody reads
        assert (await c.post("/v1/streams/live:1/close")).json() == {"segments": 7}
        headers = {**sse, "Last-Event-ID": str(got[-1]["id"])}
        async with c.stream("GET", "/v1/streams/live:1/events", headers=headers) as r:
            async for event in sse_events(r):
                got.append(event)
        check_stream(got, text)
        assert got == await read_until(c, "live:1")


async def test_sse_delivers_segments_live_before_close(served: str) -> None:
    sse = {"Accept": "text/event-stream"}
    async with httpx.AsyncClient(base_url=served, timeout=10) as c:
        got: list[dict[str, Any]] = []
        first_two = asyncio.Event()

        async def reader() -> None:
            async with c.stream("GET", "/v1/streams/live:2/events", headers=sse) as r:
                async for event in sse_events(r):
                    got.append(event)
                    if len(got) == 2:
                        first_two.set()

        await post_chunks(c, "live:2", [(0, "Hello there. ")])  # opens it
        task = asyncio.create_task(reader())
        await post_chunks(c, "live:2", [(1, "How are you? Fine")])
        await asyncio.wait_for(first_two.wait(), 60)  # out without close or idle flush
        assert [s["original"] for s in segments(got)] == ["Hello there. ", "How are you? "]
        await post_chunks(c, "live:2", [(2, " thanks.")])
        await c.post("/v1/streams/live:2/close")
        await asyncio.wait_for(task, 60)
        check_stream(got, "Hello there. How are you? Fine thanks.")


async def test_an_idle_sse_connection_gets_keep_alive_comments(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.http.routes import streams as routes

    monkeypatch.setattr(routes, "SSE_KEEPALIVE_S", 0.2)
    async with httpx.AsyncClient(base_url=served, timeout=10) as c:
        await post_chunks(c, "idle:1", [(0, "Hello there. And")])
        lines: list[str] = []
        async with c.stream("GET", "/v1/streams/idle:1/events",
                            headers={"Accept": "text/event-stream"}) as r:
            async for line in r.aiter_lines():
                lines.append(line)
                if lines.count(": ping") >= 2:
                    break
    assert lines[:3] == ["event: segment", lines[1], "id: 0"] and lines[1].startswith("data: {")
    assert lines.count(": ping") == 2


# -- seqs ----------------------------------------------------------------------------------

async def test_a_retried_seq_with_the_same_text_is_ignored() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        assert (await post_chunks(c, "r", [(0, "Hello there. "), (1, "How")])).json() == {
            "accepted_through": 1}
        for retry in ([(0, "Hello there. ")], [(1, "How"), (0, "Hello there. ")]):
            r = await post_chunks(c, "r", retry)
            assert r.json() == {"accepted_through": 1}
        await post_chunks(c, "r", [(2, " are you?")])
        assert (await c.post("/v1/streams/r/close")).json() == {"segments": 2}
        check_stream(await read_until(c, "r"), "Hello there. How are you?")


async def test_the_same_seq_with_other_text_is_409() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        await post_chunks(c, "r", [(0, "Hello "), (2, "held")])
        body = assert_problem(await post_chunks(c, "r", [(0, "Hallo ")]), 409)
        assert body["seq"] == 0
        assert_problem(await post_chunks(c, "r", [(2, "other")]), 409)
        r = await post_chunks(c, "r", [(1, "there, ")])
        assert r.json() == {"accepted_through": 2}
        await c.post("/v1/streams/r/close")
        check_stream(await read_until(c, "r"), "Hello there, held")


async def test_a_gap_is_held_until_filled() -> None:
    async with app_with(default_locale="de", max_gap=4) as run:
        c = run.client
        assert (await post_chunks(c, "g", [(0, "One. ")])).json() == {"accepted_through": 0}
        assert (await post_chunks(c, "g", [(3, "Four. "), (2, "Three. ")])).json() == {
            "accepted_through": 0}
        assert (await post_chunks(c, "g", [(5, "Six.")])).json() == {"accepted_through": 0}
        assert (await post_chunks(c, "g", [(1, "Two. ")])).json() == {"accepted_through": 3}
        assert (await post_chunks(c, "g", [(4, "Five. ")])).json() == {"accepted_through": 5}
        await c.post("/v1/streams/g/close")
        events = await read_until(c, "g")
        check_stream(events, "One. Two. Three. Four. Five. Six.")
        assert [s["original"] for s in segments(events)] == [
            "One. ", "Two. ", "Three. ", "Four. ", "Five. ", "Six."]


async def test_more_than_max_gap_held_is_409_naming_the_missing_seq() -> None:
    async with app_with(default_locale="de", max_gap=2) as run:
        c = run.client
        await post_chunks(c, "g", [(0, "a"), (1, "b")])
        assert (await post_chunks(c, "g", [(3, "d"), (4, "e")])).json() == {
            "accepted_through": 1}
        body = assert_problem(await post_chunks(c, "g", [(5, "f")]), 409)
        assert body["missing_seq"] == 2 and "seq 2" in body["detail"]
        # What was held stays held: the gap fills and the rest follows.
        assert (await post_chunks(c, "g", [(2, "c")])).json() == {"accepted_through": 4}
        assert (await post_chunks(c, "g", [(5, "f")])).json() == {"accepted_through": 5}
        await c.post("/v1/streams/g/close")
        check_stream(await read_until(c, "g"), "abcdef")


async def test_close_with_a_gap_is_409_and_chunks_after_close_are_409() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        await post_chunks(c, "g", [(0, "Start. "), (2, "end.")])
        body = assert_problem(await c.post("/v1/streams/g/close"), 409)
        assert body["missing_seq"] == 1
        await post_chunks(c, "g", [(1, "Middle ")])
        assert (await c.post("/v1/streams/g/close")).json() == {"segments": 2}
        assert (await c.post("/v1/streams/g/close")).json() == {"segments": 2}
        assert_problem(await post_chunks(c, "g", [(3, " More.")]), 409)
        check_stream(await read_until(c, "g"), "Start. Middle end.")


async def test_a_chunk_opens_an_unopened_stream_with_the_default_target() -> None:
    async with app_with(default_locale="fr") as run:
        c = run.client
        assert (await post_chunks(c, "new", [(0, "Hello world, nice day. Yes")])).status_code == 200
        r = await c.post("/v1/streams", json={"stream_id": "new", "target": "fr"})
        assert r.status_code == 200
        assert r.json() == {"stream_id": "new", "target": "fr", "target_source": "default",
                            "model": None, "policy": "translate", "previews": False}
        assert_problem(await c.post("/v1/streams", json={"stream_id": "new", "target": "de"}), 409)
        await c.post("/v1/streams/new/close")
        segs = segments(await read_until(c, "new"))
        assert [s["target"] for s in segs] == ["fr", "fr"]


async def test_opening_twice_is_200_with_the_same_target_and_409_with_another() -> None:
    async with app_with() as run:
        c = run.client
        r = await c.post("/v1/streams", json={"stream_id": "o", "target": "zh-CN"})
        assert r.status_code == 201
        assert r.json() == {"stream_id": "o", "target": "zh-CN", "target_source": "request",
                            "model": None, "policy": "translate", "previews": False}
        r = await c.post("/v1/streams", json={"stream_id": "o", "target": "ZH-cn"})
        assert r.status_code == 200 and r.json()["target"] == "zh-CN"
        body = assert_problem(await c.post("/v1/streams", json={"stream_id": "o", "target": "ja"}),
                          409)
        assert "zh-CN" in body["detail"]


async def test_a_409_on_opening_again_names_the_choices_in_words() -> None:
    """A stream opened by its first chunk, with the server's defaults, then opened by name
    with other choices: the 409 says what it has and what the request asked, never None."""
    async with app_with(default_locale="de") as run:
        c = run.client
        assert (await post_chunks(c, "w", [(0, "Hello. ")])).status_code == 200
        body = assert_problem(await c.post("/v1/streams", json={
            "stream_id": "w", "target": "de", "backend": "passthrough", "model": "m1"}), 409)
        detail = body["detail"]
        assert "None" not in detail, detail
        assert ("already open with target 'de', the server's default backend ('passthrough'), "
                "the backend's default model and policy 'translate'") in detail
        assert "this request asks for backend 'passthrough' and model 'm1'" in detail
        body = assert_problem(await c.post("/v1/streams", json={
            "stream_id": "w", "target": "ja"}), 409)
        assert "this request asks for target 'ja':" in body["detail"]


@pytest.mark.parametrize("sid", ["a b", "a/b", "ä", "x" * 129, "a;b"])
async def test_a_bad_stream_id_is_422(sid: str) -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        assert_problem(await c.post("/v1/streams", json={"stream_id": sid}), 422)
        if "/" not in sid:
            r = await c.post(f"/v1/streams/{quote(sid, safe='')}/chunks",
                             json={"chunks": [{"seq": 0, "text": "x"}]})
            assert_problem(r, 422)
        assert run.app.state.runtime.streams.streams == {}


async def test_the_longest_stream_id_is_fine_and_a_negative_seq_is_422() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        sid = "A-z0_9.:" * 16
        assert (await c.post("/v1/streams", json={"stream_id": sid})).status_code == 201
        body = assert_problem(await post_chunks(c, sid, [(-1, "x")]), 422)
        assert "seq" in body["detail"]
        assert (await post_chunks(c, sid, [(0, "x")])).json() == {"accepted_through": 0}


# -- limits --------------------------------------------------------------------------------

async def test_chunk_and_request_size_limits_are_413_and_accept_nothing() -> None:
    async with app_with(default_locale="de", max_chunk_chars=10,
                        max_chunks_per_request=3) as run:
        c = run.client
        await post_chunks(c, "l", [(0, "Hi. ")])
        body = assert_problem(await post_chunks(c, "l", [(1, "x" * 5), (2, "y" * 11)]), 413)
        assert "THINKTRANS_MAX_CHUNK_CHARS" in body["detail"]
        body = assert_problem(await post_chunks(c, "l", [(i, "z") for i in range(1, 5)]), 413)
        assert "THINKTRANS_MAX_CHUNKS_PER_REQUEST" in body["detail"]
        assert (await post_chunks(c, "l", [(1, "x" * 10)])).json() == {"accepted_through": 1}


async def test_max_stream_buffer_chars_is_413() -> None:
    async with app_with(default_locale="de", max_stream_buffer_chars=64) as run:
        c = run.client
        await post_chunks(c, "b", [(0, "a" * 30)])  # no sentence end: it stays buffered
        assert (await post_chunks(c, "b", [(2, "c" * 30)])).json() == {"accepted_through": 0}
        body = assert_problem(await post_chunks(c, "b", [(1, "b" * 10)]), 413)
        assert body["missing_seq"] == 1
        assert (await post_chunks(c, "b", [(1, "b" * 4)])).json() == {"accepted_through": 2}


async def test_max_streams_is_429_with_retry_after() -> None:
    async with app_with(default_locale="de", max_streams=2) as run:
        c = run.client
        await c.post("/v1/streams", json={"stream_id": "m1"})
        await post_chunks(c, "m2", [(0, "x")])
        r = await c.post("/v1/streams", json={"stream_id": "m3"})
        assert_problem(r, 429)
        assert int(r.headers["Retry-After"]) >= 1
        r = await post_chunks(c, "m4", [(0, "x")])
        assert_problem(r, 429)
        assert "Retry-After" in r.headers
        assert (await c.delete("/v1/streams/m1")).status_code == 204
        assert (await c.post("/v1/streams", json={"stream_id": "m3"})).status_code == 201


async def test_unknown_and_deleted_streams_are_404() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        assert_problem(await c.get("/v1/streams/nope/events"), 404)
        assert_problem(await c.post("/v1/streams/nope/close"), 404)
        assert_problem(await c.delete("/v1/streams/nope"), 404)
        await post_chunks(c, "d", [(0, "Hello there. Bye")])
        assert len(await poll(c, "d", wait_ms=2000)) == 1
        r = await c.delete("/v1/streams/d")
        assert r.status_code == 204 and r.content == b""
        assert_problem(await c.get("/v1/streams/d/events"), 404)
        assert_problem(await c.post("/v1/streams/d/close"), 404)
        assert_problem(await c.delete("/v1/streams/d"), 404)


async def test_an_idle_stream_expires() -> None:
    async with app_with(default_locale="de", stream_idle_expire_s=0.3) as run:
        c = run.client
        await post_chunks(c, "idle", [(0, "Hello there. Bye")])
        await c.post("/v1/streams", json={"stream_id": "busy"})
        assert await run.metric("thinktrans_open_streams") == 2
        give_up = time.monotonic() + 120  # a hang guard, not what is measured
        while (await c.get("/v1/streams/idle/events")).status_code == 200:
            assert time.monotonic() < give_up, "the idle stream did not expire"
            await post_chunks(c, "busy", [(0, "")])  # retries keep "busy" alive
            await asyncio.sleep(0.05)
        assert_problem(await c.get("/v1/streams/idle/events"), 404)
        assert (await c.get("/v1/streams/busy/events")).status_code == 200
        assert await run.metric("thinktrans_open_streams") == 1


async def test_a_full_backend_queue_is_503_with_retry_after_and_accepts_nothing() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="de", max_queue_size=1, deadline_ms=5000) as run:
        c = run.client
        parts = ["First sentence is here. S", "econd sentence is here. T", "hird sentence."]
        assert (await post_chunks(c, "q", [(0, parts[0])])).json() == {"accepted_through": 0}
        await asyncio.wait_for(fake.started.wait(), 60)  # first batch in flight, queue empty
        assert (await post_chunks(c, "q", [(1, parts[1])])).json() == {"accepted_through": 1}
        r = await post_chunks(c, "q", [(2, parts[2])])
        assert_problem(r, 503)
        assert int(r.headers["Retry-After"]) >= 1
        gate.set()
        await read_until(c, "q", "segment", count=2)
        assert (await post_chunks(c, "q", [])).json() == {"accepted_through": 1}
        assert (await post_chunks(c, "q", [(2, parts[2])])).json() == {"accepted_through": 2}
        await c.post("/v1/streams/q/close")
        events = await read_until(c, "q")
        check_stream(events, "".join(parts))
        assert [s["status"] for s in segments(events)] == ["translated"] * 3
        sent = [t for call in fake.calls for t in call.texts]
        assert sorted(sent) == sorted(["First sentence is here.", "Second sentence is here.",
                                       "Third sentence."])


async def test_one_request_cutting_more_segments_than_the_queue_holds_drops_none() -> None:
    """Accepted text is never dropped: each of its segments gets translated."""
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="de", max_queue_size=2, deadline_ms=300) as run:
        c = run.client
        text = "One sentence here. Two sentence here. Three sentence here. Four sentence here."
        r = await post_chunks(c, "q2", [(0, text)])
        if r.status_code == 503:  # refusing the whole request is fine too, if it took nothing
            r = await post_chunks(c, "q2", [])
            assert r.status_code == 404 or r.json() == {"accepted_through": -1}
            return
        await read_until(c, "q2", "segment", count=1)
        gate.set()
        await c.post("/v1/streams/q2/close")
        events = await read_until(c, "q2")
        check_stream(events, text)
        final = {s["index"]: s["status"] for s in segments(events)}
        final.update({e["data"]["index"]: e["data"]["status"]
                      for e in events if e["type"] == "update"})
        assert set(final.values()) == {"translated"}, segments(events)


async def test_a_409_mid_request_still_flushes_what_it_accepted_when_idle() -> None:
    """seq 0 was accepted (the 409 asks for seq 1 next); idle must still flush it."""
    async with app_with(default_locale="de", max_gap=0, flush_idle_ms=100) as run:
        c = run.client
        body = assert_problem(await post_chunks(c, "p", [(0, "Thinking about it"), (2, "x")]), 409)
        assert body["missing_seq"] == 1
        events = await poll(c, "p", wait_ms=1500)
        assert [s["original"] for s in segments(events)] == ["Thinking about it"]


# -- flush_idle_ms and the POST that never waits -------------------------------------------

async def test_text_without_a_sentence_end_goes_out_after_flush_idle_ms() -> None:
    async with app_with(default_locale="de", flush_idle_ms=500) as run:
        c = run.client
        t0 = time.monotonic()
        await post_chunks(c, "i", [(0, "Thinking about the ans")])
        await post_chunks(c, "i", [(1, "wer now")])
        assert await poll(c, "i", wait_ms=100) == []
        events = await read_until(c, "i", "segment")
        assert time.monotonic() - t0 >= 0.45  # not before flush_idle_ms: its timer's guarantee
        assert [s["original"] for s in segments(events)] == ["Thinking about the answer now"]
        await post_chunks(c, "i", [(2, ". Done.")])
        await c.post("/v1/streams/i/close")
        check_stream(await read_until(c, "i"), "Thinking about the answer now. Done.")


async def test_a_sentence_end_goes_out_at_once_and_the_post_never_waits() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="de", flush_idle_ms=10_000,
                        deadline_ms=10_000) as run:
        c = run.client
        r = await post_chunks(c, "n", [(0, "First sentence is in English. Sec")])
        # Answered while the translation is held: the POST never waits for it.
        assert r.json() == {"accepted_through": 0} and not gate.is_set()
        await asyncio.wait_for(fake.started.wait(), 60)  # sent before close or idle flush
        assert fake.calls[0].texts == ["First sentence is in English."]
        gate.set()
        events = await read_until(c, "n", "segment")
        # Out on its translation, long before flush_idle_ms or the deadline (10 s): the
        # segment is translated, not a deadline's original.
        assert segments(events)[0]["original"] == "First sentence is in English. "
        assert segments(events)[0]["status"] == "translated"


async def test_an_idle_flush_inside_a_code_block_keeps_the_code_block() -> None:
    """A pause mid-fence must not end the fence: prose after it is still prose."""
    async with app_with(default_locale="de", flush_idle_ms=100) as run:
        c = run.client
        await post_chunks(c, "f", [(0, "Here is the code:\n```python\nx = compute(1)\n")])
        await asyncio.sleep(0.4)  # the agent pauses mid-block: an idle flush
        prose = "Now the explanation follows in English. "
        await post_chunks(c, "f", [(1, "print(x)\n```\n" + prose + "Done.")])
        await c.post("/v1/streams/f/close")
        events = await read_until(c, "f")
        check_stream(events, "Here is the code:\n```python\nx = compute(1)\nprint(x)\n```\n"
                     + prose + "Done.")
        by_text = {s["original"]: s["status"] for s in segments(events)}
        assert by_text.get(prose) == "translated", segments(events)


# -- language per stream, and where the target comes from ----------------------------------

async def test_short_segments_take_the_streams_language() -> None:
    fake = FakeTranslator()
    async with app_with(fake) as run:
        c = run.client
        r = await c.post("/v1/streams", json={"stream_id": "de", "target": "en"})
        assert r.json()["target_source"] == "request"
        text = ("Der Benutzer möchte wissen, wie das Wetter morgen in Berlin wird. OK. Hmm,\n"
                "ich prüfe das noch einmal genau. ")
        await post_chunks(c, "de", list(enumerate(text[i:i + 3] for i in range(0, len(text), 3))))
        await c.post("/v1/streams/de/close")
        events = await read_until(c, "de")
        check_stream(events, text)
        by_text = {s["original"]: s for s in segments(events)}
        for short in ("OK. ", "Hmm,\n"):
            assert by_text[short]["source_lang"] == "de", by_text[short]
            assert by_text[short]["status"] == "translated"  # not kept as English
        sent = {t: call.source for call in fake.calls for t in call.texts}
        assert sent["OK."] == "de" and sent["Hmm,"] == "de"


GERMAN = "Der Benutzer möchte wissen, wie das Wetter morgen in Berlin wird. "


async def memory_run(text: str, **overrides: Any) -> tuple[dict[str, dict[str, Any]], str]:
    """One stream of ``text`` in a single chunk (target en) through the fake backend; its
    segments by original, and the metrics after it."""
    fake = FakeTranslator()
    async with app_with(fake, **overrides) as run:
        c = run.client
        await c.post("/v1/streams", json={"stream_id": "m", "target": "en"})
        await post_chunks(c, "m", [(0, text)])
        await c.post("/v1/streams/m/close")
        events = await read_until(c, "m")
        check_stream(events, text)
        metrics = (await c.get("/metrics")).text
    return {s["original"]: s for s in segments(events)}, metrics


async def test_a_short_segment_between_two_of_the_streams_language_is_that_language() -> None:
    text = GERMAN + "OK. Ich prüfe das noch einmal genau. "
    by_text, metrics = await memory_run(text)
    assert by_text["OK. "]["source_lang"] == "de" and by_text["OK. "]["status"] == "translated"
    assert 'thinktrans_stream_memory_total{outcome="kept"} 1.0' in metrics


async def test_a_short_segment_before_a_switch_keeps_its_own_language() -> None:
    """German, then "OK.", then English: "OK." opens the English part; memory alone (the
    recent language) would have sent it to be translated from German."""
    text = GERMAN + "OK. Let me check the forecast once more before I answer. "
    by_text, metrics = await memory_run(text)
    assert by_text["OK. "]["status"] == "same_language", by_text["OK. "]
    assert 'thinktrans_stream_memory_total{outcome="own"} 1.0' in metrics
    # Without the wait, the recent language decides at once, as before.
    by_text, metrics = await memory_run(text, stream_memory_wait_ms=0)
    assert by_text["OK. "]["source_lang"] == "de" and by_text["OK. "]["status"] == "translated"
    assert "thinktrans_stream_memory_total{" not in metrics


async def test_a_clear_script_never_leans_on_memory() -> None:
    """One Han character in a German stream is Chinese, unreliable or not."""
    by_text, metrics = await memory_run(GERMAN + "好。Ich prüfe das noch einmal genau. ")
    assert by_text["好。"]["source_lang"].startswith("zh"), by_text
    assert "thinktrans_stream_memory_total{" not in metrics


async def test_a_held_segment_goes_out_when_the_wait_runs_out() -> None:
    """Nothing follows "OK." for a while: it is decided from the recent language after
    stream_memory_wait_ms, long before an idle flush, and the stream stays open."""
    fake = FakeTranslator()
    async with app_with(fake, stream_memory_wait_ms=200, flush_idle_ms=60_000) as run:
        c = run.client
        await c.post("/v1/streams", json={"stream_id": "w", "target": "en"})
        t0 = time.monotonic()
        await post_chunks(c, "w", [(0, GERMAN + "OK. Und")])
        events = await read_until(c, "w", stop="segment", count=2)
        waited = time.monotonic() - t0
        ok = [s for s in segments(events) if s["original"] == "OK. "]
        assert ok and ok[0]["source_lang"] == "de", segments(events)
        # Out after the wait (its timer's guarantee), and before any idle flush (60 s): the
        # stream is still open and nothing else flushed it.
        assert waited > 0.15, waited
        await post_chunks(c, "w", [(1, " jetzt weiter. ")])
        await c.post("/v1/streams/w/close")
        check_stream(await read_until(c, "w"), GERMAN + "OK. Und jetzt weiter. ")


async def test_a_held_segment_takes_its_context_only_when_translated() -> None:
    """The context a backend sees is the same whether a short segment waited or not."""
    seen = {}
    for wait in (300, 0):
        fake = FakeTranslator(uses_context=True)
        async with app_with(fake, stream_memory_wait_ms=wait, context_max_chars=1000) as run:
            c = run.client
            await c.post("/v1/streams", json={"stream_id": "c", "target": "de"})
            text = (GERMAN + "OK. Ich prüfe das noch einmal genau. "
                    "Let me check the forecast once more before I answer. ")
            await post_chunks(c, "c", [(0, text)])
            await c.post("/v1/streams/c/close")
            check_stream(await read_until(c, "c"), text)
            seen[wait] = [(call.texts, call.contexts) for call in fake.calls]
    assert seen[300] == seen[0], seen


async def test_signs_within_a_script_range_are_not_an_error() -> None:
    """× is in the Latin range but no letter: the segment is detected as nothing, and the
    stream goes on (it failed with 500 and lost the chunk's first segment)."""
    async with app_with(default_locale="en") as run:
        c = run.client
        r = await c.post("/v1/detect", json={"texts": ["12 × 4 = 48", "١٢٣ ؟"]})
        assert r.status_code == 200 and [x["lang"] for x in r.json()["results"]] == [None, None]
        text = "bob@example.com × 2\n\nDanke schön für die Hilfe heute. "
        r = await post_chunks(c, "x", [(0, text)])
        assert r.status_code == 200, r.text
        await c.post("/v1/streams/x/close")
        check_stream(await read_until(c, "x"), text)


def test_leans_on_memory() -> None:
    from service.text.decide import leans_on_memory
    from service.text.detect import Detection

    unsure_en = Detection("en", 0.4, False)
    assert leans_on_memory(unsure_en, "de")
    assert leans_on_memory(Detection(None, 0.0, False), "de")
    assert not leans_on_memory(unsure_en, None)  # no memory yet
    assert not leans_on_memory(Detection("en", 0.95, True), "de")  # clear enough alone
    assert not leans_on_memory(Detection("en", 0.4, False), "en-GB")  # memory says the same
    assert not leans_on_memory(Detection("zh-Hans", 0.5, False), "de")  # another script
    from service.text.decide import settled_memory

    assert settled_memory("de", "de-AT") == "de"  # between two of its language
    assert settled_memory("de", None) == "de"  # nothing clear came next
    assert settled_memory("de", "en") is None  # a switch: its own detection


async def test_the_target_comes_from_user_text_else_the_default_else_none() -> None:
    async with app_with(default_locale="fr") as run:
        c = run.client
        r = await c.post("/v1/streams", json={
            "stream_id": "u", "user_text": "これは日本語のメッセージです。天気を教えてください。"})
        assert r.status_code == 201
        assert r.json() == {"stream_id": "u", "target": "ja", "target_source": "user_text",
                            "model": None, "policy": "translate", "previews": False}
        await post_chunks(c, "u", [(0, "The user asked about the weather.")])
        await c.post("/v1/streams/u/close")
        assert [s["target"] for s in segments(await read_until(c, "u"))] == ["ja"]
        r = await c.post("/v1/streams", json={"stream_id": "d"})
        assert r.json() == {"stream_id": "d", "target": "fr", "target_source": "default",
                            "model": None, "policy": "translate", "previews": False}
    async with app_with() as run:
        c = run.client
        r = await c.post("/v1/streams", json={"stream_id": "n"})
        assert r.json() == {"stream_id": "n", "target": None, "target_source": "none",
                            "model": None, "policy": "translate", "previews": False}
        await post_chunks(c, "n", [(0, "Hello there, this is English.\n" + CODE)])
        await c.post("/v1/streams/n/close")
        segs = segments(await read_until(c, "n"))
        assert [(s["status"], s["target"]) for s in segs] == [("no_target", None),
                                                               ("skipped", None)]


# -- metrics -------------------------------------------------------------------------------

async def test_stream_metrics() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="zh-CN", deadline_ms=200) as run:
        c = run.client
        assert await run.metric("thinktrans_open_streams") == 0
        await post_chunks(c, "m", [(0, SLOW + CHINESE + CODE + "A quick one. ")])
        assert await run.metric("thinktrans_open_streams") == 1
        await read_until(c, "m", "segment", count=3)
        gate.set()
        await c.post("/v1/streams/m/close")
        events = await read_until(c, "m")
        assert [s["status"] for s in segments(events)] == [
            "deadline", "same_language", "skipped", "translated"]
        assert await run.metric("thinktrans_deadline_misses_total") == 1
        for status, backend in [("deadline", ""), ("same_language", ""), ("skipped", ""),
                                ("translated", "fake")]:
            assert await run.metric("thinktrans_segments_total", status=status,
                                    backend=backend) == 1
            assert await run.metric("thinktrans_segment_latency_seconds_count",
                                    status=status) == 1
        assert await run.metric("thinktrans_segment_latency_seconds_sum",
                                status="deadline") >= 0.19
        text = (await c.get("/metrics")).text
        # Ended: kept for late readers, but no longer open (nor counted in max_streams).
        assert "thinktrans_open_streams 0.0" in text
        assert 'thinktrans_segments_total{backend="",status="deadline"} 1.0' in text
        await c.delete("/v1/streams/m")
        assert await run.metric("thinktrans_open_streams") == 0


async def test_deleting_a_stream_with_translations_in_flight_counts_no_deadline_miss() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="de", deadline_ms=10_000) as run:
        c = run.client
        await post_chunks(c, "x", [(0, "One sentence here. Two sentence here. Three")])
        await asyncio.wait_for(fake.started.wait(), 60)
        assert (await c.delete("/v1/streams/x")).status_code == 204
        await asyncio.sleep(0.1)  # let the cancelled translations settle
        assert await run.metric("thinktrans_deadline_misses_total") == 0
        assert await run.metric("thinktrans_segments_total", status="deadline", backend="") == 0


# -- over real HTTP, as curl would see it --------------------------------------------------

@pytest.fixture
def serve_process() -> Iterator[str]:
    """`python -m service.cli serve` in its own process (uvicorn, default loop)."""
    with serve_cli(THINKTRANS_DEFAULT_LOCALE="zh-CN") as srv:
        yield srv.url


def test_a_stream_over_real_http(serve_process: str) -> None:
    url = serve_process
    text = "Hmm, the user said hello. 我们来看看。\n```python\nx = 1\n```\nLet me answer"
    with httpx.Client(base_url=url, timeout=10) as c:
        r = c.post("/v1/streams", json={"stream_id": "curl:1", "user_text": None})
        assert r.status_code == 201 and r.json()["target"] == "zh-CN"
        for seq, i in enumerate(range(0, len(text), 3)):
            r = c.post("/v1/streams/curl:1/chunks",
                       json={"chunks": [{"seq": seq, "text": text[i:i + 3]}]})
            assert r.json() == {"accepted_through": seq}
        got: list[dict[str, Any]] = []
        with c.stream("GET", "/v1/streams/curl:1/events",
                      headers={"Accept": "text/event-stream"}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            block: list[str] = []
            for line in r.iter_lines():
                if line:
                    block.append(line)
                    continue
                got += parse_sse("\n".join(block))
                block = []
                if len(got) == 3:  # every complete segment is out before close
                    assert c.post("/v1/streams/curl:1/close").json() == {"segments": 4}
        check_stream(got, text)
        assert [(s["status"], s["target"]) for s in segments(got)] == [
            ("translated", "zh-CN"), ("same_language", "zh-CN"), ("skipped", "zh-CN"),
            ("translated", "zh-CN")]
        assert got[-1] == {"id": 4, "type": "end", "data": {"segments": 4}}


async def test_an_ended_stream_does_not_hold_a_max_streams_slot() -> None:
    async with app_with(None, max_streams=1) as run:
        c = run.client
        await post_chunks(c, "first", [(0, "Done already. ")])
        await c.post("/v1/streams/first/close")
        await read_until(c, "first")
        r = await c.post("/v1/streams", json={"stream_id": "second"})
        assert r.status_code == 201
        r = await c.post("/v1/streams", json={"stream_id": "third"})
        assert r.status_code == 429


async def test_a_refused_chunk_says_how_far_the_request_was_accepted() -> None:
    async with app_with(None) as run:
        c = run.client
        await post_chunks(c, "r", [(0, "Hello there. ")])
        r = await c.post("/v1/streams/r/chunks", json={"chunks": [
            {"seq": 1, "text": "More. "}, {"seq": 0, "text": "Other text. "}]})
        assert r.status_code == 409
        assert r.json()["accepted_through"] == 1


# -- retention of ended streams, alone -----------------------------------------------------


def test_retention_evicts_the_oldest_past_either_bound_and_remembers_them_as_gone() -> None:
    kept = Retention(max_streams=2, max_bytes=100)
    assert kept.keep("a", 10) == [] and kept.keep("b", 20) == []
    assert kept.keep("c", 30) == ["a"]  # past the count
    assert (len(kept), kept.bytes) == (2, 50)
    assert kept.keep("d", 80) == ["b", "c"]  # past the bytes: as many as it takes
    assert (len(kept), kept.bytes) == (1, 80)
    for gone in ("a", "b", "c"):
        with pytest.raises(EventsGone, match="THINKTRANS_MAX_ENDED_STREAMS=2") as caught:
            kept.check(gone)
        assert caught.value.extra["evicted"] is True
    kept.check("d")  # kept, not gone
    kept.forget("d")  # deleted: no longer counted, and not gone either
    assert (len(kept), kept.bytes) == (0, 0)
    kept.check("d")
    kept.reuse("a")  # a new stream took the id
    kept.check("a")


def test_retention_remembers_a_bounded_number_of_gone_ids_oldest_forgotten_first() -> None:
    kept = Retention(max_streams=0, max_bytes=100)
    for i in range(GONE_REMEMBERED + 1):
        assert kept.keep(f"s{i}", 1) == [f"s{i}"]
    kept.check("s0")  # forgotten: a 404 now, not a 410
    with pytest.raises(EventsGone):
        kept.check("s1")
