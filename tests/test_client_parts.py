"""The parts of ``ThinkingStream``, each on its own: pending text, posting, reading, falling back.

HTTP goes through ``httpx.MockTransport`` to ``FakeSidecar``, which answers as the contract
says (or as a test scripts it) and records every request; timing is driven by gates and a
fake clock, never asserted from the wall clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from thinktrans_client.client import ThinktransClient
from thinktrans_client.fallback import Fallback, StallClock
from thinktrans_client.pending import PendingText
from thinktrans_client.posting import (
    MAX_CHARS_PER_POST,
    MAX_CHUNK_CHARS,
    MAX_CHUNKS_PER_POST,
    ChunkPoster,
)
from thinktrans_client.reading import EventReader
from thinktrans_client.reasons import http_reason, transport_reason
from thinktrans_client.results import SegmentUpdate, TranslatedSegment
from thinktrans_client.sidecar import SidecarError, Skipped

Answer = httpx.Response | Callable[[httpx.Request], Awaitable[httpx.Response]]


@dataclass
class Seen:
    """One request the fake sidecar got."""

    method: str
    route: str  # open, chunks, close, events, delete
    body: Any
    params: dict[str, str]


def _route(request: httpx.Request) -> str:
    if request.method == "DELETE":
        return "delete"
    if request.url.path == "/v1/streams":
        return "open"
    return request.url.path.rsplit("/", 1)[-1]


def _default(route: str, body: Any) -> httpx.Response:
    """What a sidecar that works answers."""
    if route == "open":
        return httpx.Response(200, json={"stream_id": body["stream_id"],
                                         "target": body["target"] or "de",
                                         "target_source": "request"})
    if route == "chunks":
        return httpx.Response(200, json={
            "accepted_through": max(c["seq"] for c in body["chunks"])})
    if route == "close":
        return httpx.Response(200, json={"segments": 0})
    if route == "events":
        return httpx.Response(200, json={"events": []})
    return httpx.Response(204)


class FakeSidecar:
    """A sidecar behind ``httpx.MockTransport``: scripted answers per route (else a working
    sidecar's), a record of every request, and an event set at each one."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.script: dict[str, deque[Answer]] = defaultdict(deque)
        self.changed = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        route = _route(request)
        body = json.loads(request.content) if request.content else None
        self.seen.append(Seen(request.method, route, body, dict(request.url.params)))
        self.changed.set()
        queue = self.script[route]
        if not queue:
            return _default(route, body)
        answer = queue.popleft()
        return answer if isinstance(answer, httpx.Response) else await answer(request)

    def client(self, *, timeout_s: float = 2.0, stall_s: float = 10.0,
               poll_wait_s: float = 1.0) -> ThinktransClient:
        return ThinktransClient("http://sidecar", transport=httpx.MockTransport(self.handle),
                                timeout_s=timeout_s, stall_s=stall_s, poll_wait_s=poll_wait_s)

    def bodies(self, route: str) -> list[Any]:
        return [s.body for s in self.seen if s.route == route]

    async def until(self, check: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Wait (generously bounded) until ``check`` holds after some request."""
        async with asyncio.timeout(timeout_s):
            while not check():
                self.changed.clear()
                await self.changed.wait()


class Gate:
    """An answer that waits for ``open`` to be set; ``entered`` once a request is waiting,
    ``cancelled`` once a waiting request was given up."""

    def __init__(self, then: httpx.Response | None = None) -> None:
        self.open = asyncio.Event()
        self.entered = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.then = then or httpx.Response(200, json={"events": []})

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.entered.set()
        try:
            await self.open.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return self.then


@dataclass
class Budgets:
    """The ``Sidecar`` protocol without HTTP: budgets, and a record of noted failures."""

    timeout_s: float = 2.0
    stall_s: float = 10.0
    poll_wait_s: float = 1.0
    noted: list[SidecarError] = field(default_factory=list)

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: Mapping[str, Any] | None = None, wait_s: float = 0.0) -> Any:
        raise AssertionError(f"no request expected, got {method} {path}")

    def note_failure(self, exc: SidecarError) -> None:
        self.noted.append(exc)


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def problem(status: int, retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(status, headers=headers,
                          json={"type": "urn:thinktrans:problem:overloaded"})


# -- PendingText ---------------------------------------------------------------------------


def test_pending_text_is_taken_from_the_front_across_its_parts() -> None:
    pending = PendingText()
    for part in ("Hel", "lo. ", "Wor", "ld."):
        pending.append(part)
    assert len(pending) == 13
    assert pending.startswith("Hello. W") and pending.startswith("")
    assert not pending.startswith("Help") and not pending.startswith("Hello. World.!")
    assert pending.take(5) == "Hello" and len(pending) == 8
    assert pending.startswith(". World.")
    assert pending.take(100) == ". World." and len(pending) == 0


def test_pending_text_gives_out_segments_with_the_next_index() -> None:
    pending = PendingText()
    pending.append("One. Two.")
    assert pending.continues(0, "One. ")
    assert not pending.continues(1, "One. ")  # not the next index
    assert not pending.continues(0, "Two.")  # not the next text
    assert pending.give_out(5) == (0, "One. ")
    assert pending.continues(1, "Two.")
    assert pending.give_out(4) == (1, "Two.")
    assert pending.next_index == 2 and len(pending) == 0


# -- ChunkPoster ---------------------------------------------------------------------------


class Posting:
    """A ChunkPoster on a fake sidecar, with a record of what it told its owner."""

    def __init__(self, sidecar: FakeSidecar, client: ThinktransClient, *,
                 flush_interval_s: float = 3600.0, flush_chars: int = 1_000_000,
                 body: Mapping[str, Any] | None = None) -> None:
        self.sidecar = sidecar
        self.answers: list[Any] = []
        self.failures: list[SidecarError] = []
        self.failed = asyncio.Event()
        self.body = dict(body or {"stream_id": "s1", "target": "de"})
        self.poster = ChunkPoster(client, "s1", open_body=lambda: self.body,
                                  on_open=self._opened, on_failure=self._failed,
                                  flush_interval_s=flush_interval_s, flush_chars=flush_chars)

    def _opened(self, data: Any) -> None:
        self.answers.append(data["target_source"])  # KeyError when malformed, as the owner's

    def _failed(self, exc: SidecarError) -> None:
        self.failures.append(exc)
        self.failed.set()

    def chunks(self) -> list[tuple[int, str]]:
        return [(c["seq"], c["text"]) for body in self.sidecar.bodies("chunks")
                for c in body["chunks"]]

    async def closed(self) -> None:
        await self.sidecar.until(lambda: bool(self.sidecar.bodies("close")))

    async def failure(self) -> SidecarError:
        async with asyncio.timeout(10):
            await self.failed.wait()
        [exc] = self.failures
        return exc


async def test_poster_opens_posts_one_batch_and_closes() -> None:
    sidecar = FakeSidecar()
    async with sidecar.client() as client:
        posting = Posting(sidecar, client)
        assert not posting.poster.started
        for delta in ("Hel", "lo", " there."):
            posting.poster.add(delta)
        assert posting.poster.started
        posting.poster.close()
        await posting.closed()
        await posting.poster.settle()
    assert [s.route for s in sidecar.seen] == ["open", "chunks", "close"]
    assert sidecar.bodies("open") == [{"stream_id": "s1", "target": "de"}]
    assert posting.answers == ["request"] and posting.poster.opened.is_set()
    assert posting.chunks() == [(0, "Hello there.")]  # the deltas batched into one chunk
    assert posting.failures == []


async def test_poster_posts_once_flush_chars_are_waiting() -> None:
    sidecar = FakeSidecar()
    async with sidecar.client() as client:
        posting = Posting(sidecar, client, flush_chars=4)  # the interval is an hour
        posting.poster.add("ab")
        posting.poster.add("cd")
        await sidecar.until(lambda: bool(posting.chunks()))
        posting.poster.add("e")
        posting.poster.close()
        await posting.closed()
    assert posting.chunks() == [(0, "abcd"), (1, "e")]


async def test_poster_posts_flush_interval_s_after_the_first_delta() -> None:
    sidecar = FakeSidecar()
    async with sidecar.client() as client:
        posting = Posting(sidecar, client, flush_interval_s=0.01)  # flush_chars: a million
        posting.poster.add("ab")
        await sidecar.until(lambda: bool(posting.chunks()))
        posting.poster.add("cd")
        await sidecar.until(lambda: len(posting.chunks()) == 2)
        assert not sidecar.bodies("close")  # not closed: the interval posted both
    assert posting.chunks() == [(0, "ab"), (1, "cd")]


async def test_a_503_is_retried_with_the_same_seqs_and_text() -> None:
    sidecar = FakeSidecar()
    sidecar.script["chunks"].extend([problem(503, "0"), problem(429, "0")])
    async with sidecar.client() as client:
        posting = Posting(sidecar, client)
        posting.poster.add("Same text.")
        posting.poster.close()
        await posting.closed()
    posts = sidecar.bodies("chunks")
    assert len(posts) == 3 and posts[0] == posts[1] == posts[2]
    assert posts[0] == {"chunks": [{"seq": 0, "text": "Same text."}]}
    assert posting.failures == []


async def test_a_retry_after_past_the_budget_fails_at_once() -> None:
    """A draining sidecar asks for seconds more than ``timeout_s``: no waiting for them."""
    sidecar = FakeSidecar()
    sidecar.script["open"].append(problem(503, "600"))
    async with sidecar.client(timeout_s=2.0) as client:
        posting = Posting(sidecar, client)
        posting.poster.add("Hi.")
        exc = await posting.failure()  # within the generous 10 s, not 600 s
    assert exc.status == 503 and "past the client's budget" in exc.reason
    assert [s.route for s in sidecar.seen] == ["open"]


async def test_an_error_answer_is_not_retried() -> None:
    sidecar = FakeSidecar()
    sidecar.script["chunks"].append(httpx.Response(
        409, json={"type": "urn:thinktrans:problem:gap"}))
    async with sidecar.client() as client:
        posting = Posting(sidecar, client)
        posting.poster.add("Hi.")
        posting.poster.close()
        exc = await posting.failure()
    assert (exc.reason, exc.status, exc.slug) == (
        "the sidecar refused the request as contradicting the stream's state (HTTP 409 gap)",
        409, "gap")
    assert [s.route for s in sidecar.seen] == ["open", "chunks"]


@pytest.mark.parametrize(("route", "answer", "reason"), [
    ("open", {"target": "de"}, "the sidecar's answer to opening the stream is malformed"),
    ("chunks", {"accepted": 0}, "the sidecar's answer to the chunks is malformed"),
    ("chunks", {"accepted_through": -1},
     "the sidecar did not accept the chunks (accepted through seq -1, below seq 0)"),
])
async def test_a_malformed_answer_fails_posting(route: str, answer: Any, reason: str) -> None:
    sidecar = FakeSidecar()
    sidecar.script[route].append(httpx.Response(200, json=answer))
    async with sidecar.client() as client:
        posting = Posting(sidecar, client)
        posting.poster.add("Hi.")
        posting.poster.close()
        assert (await posting.failure()).reason == reason
    assert not sidecar.bodies("close")


async def test_a_huge_text_goes_in_bounded_chunks_and_posts() -> None:
    sidecar = FakeSidecar()
    text = "".join(chr(ord("a") + i % 26) for i in range(MAX_CHARS_PER_POST * 2 + 5))
    async with sidecar.client() as client:
        posting = Posting(sidecar, client)
        posting.poster.add(text)
        posting.poster.close()
        await posting.closed()
    posts = sidecar.bodies("chunks")
    assert len(posts) == 3
    assert all(len(body["chunks"]) <= MAX_CHUNKS_PER_POST for body in posts)
    assert all(sum(len(c["text"]) for c in body["chunks"]) <= MAX_CHARS_PER_POST
               for body in posts)
    chunks = posting.chunks()
    assert all(len(text) <= MAX_CHUNK_CHARS for _, text in chunks)
    assert [seq for seq, _ in chunks] == list(range(len(chunks)))
    assert "".join(text for _, text in chunks) == text


async def test_a_high_surrogate_at_the_end_waits_for_the_next_delta() -> None:
    sidecar = FakeSidecar()
    async with sidecar.client() as client:
        posting = Posting(sidecar, client, flush_interval_s=0.01)
        posting.poster.add("ok \ud83d")
        await sidecar.until(lambda: bool(posting.chunks()))
        assert posting.chunks() == [(0, "ok ")]  # the high half is held back


async def test_a_lone_surrogate_fails_posting() -> None:
    sidecar = FakeSidecar()
    async with sidecar.client() as client:
        posting = Posting(sidecar, client)
        posting.poster.add("a \udc00 b")
        posting.poster.close()
        exc = await posting.failure()
    assert exc.reason == "the thinking text holds a lone surrogate, which cannot be sent as UTF-8"
    assert posting.chunks() == []


async def test_stop_lets_a_post_in_flight_end_and_nothing_more_is_posted() -> None:
    """Cut off, a chunk POST could still reach the sidecar after the stream's DELETE and
    open the stream again: the post in flight is let end, and nothing follows it, not even
    the close."""
    sidecar = FakeSidecar()
    gate = Gate(httpx.Response(200, json={"accepted_through": 0}))
    sidecar.script["chunks"].append(gate)
    async with sidecar.client(timeout_s=30.0) as client:
        posting = Posting(sidecar, client)
        posting.poster.add("Hi.")
        posting.poster.close()
        async with asyncio.timeout(10):
            await gate.entered.wait()
            posting.poster.stop()
            settled = asyncio.create_task(posting.poster.settle(hurry=True))
            await asyncio.sleep(0)  # settle waits for the post, which the gate holds
            assert not settled.done()
            gate.open.set()
            await settled
        assert not gate.cancelled.is_set()
        assert not posting.poster.unanswered
        posting.poster.add("More.")
    assert [s.route for s in sidecar.seen] == ["open", "chunks"]
    assert posting.failures == []  # stopped by its owner, which knows why


async def test_a_poster_stopped_before_its_first_delta_never_starts() -> None:
    """A stream that skips the sidecar from the start: its deltas are not even queued."""
    sidecar = FakeSidecar()
    async with sidecar.client() as client:
        posting = Posting(sidecar, client)
        posting.poster.stop()
        posting.poster.add("Hi.")
        posting.poster.close()
        await posting.poster.settle()
        assert not posting.poster.started
    assert sidecar.seen == []


# -- EventReader ---------------------------------------------------------------------------


def segment(event_id: int, index: int, original: str, status: str = "translated"
            ) -> dict[str, Any]:
    return {"id": event_id, "type": "segment", "data": {
        "index": index, "original": original, "text": f"<{original}>", "status": status}}


class Reading:
    """An EventReader on a fake sidecar, its stream already open, with a fake stall clock."""

    def __init__(self, client: ThinktransClient, text: str = "", *,
                 opened: bool = True) -> None:
        self.pending = PendingText()
        self.pending.append(text)
        self.clock = Clock()
        self.stall = StallClock(client, clock=self.clock)
        self.fallback = Fallback(client, "s1", self.pending)
        self.opened = asyncio.Event()
        if opened:
            self.opened.set()
        self.reader = EventReader(client, "s1", pending=self.pending, stall=self.stall,
                                  fallback=self.fallback, opened=self.opened)


async def test_reader_takes_segments_updates_and_the_end_in_order() -> None:
    sidecar = FakeSidecar()
    events = [segment(0, 0, "Hello. ", "deadline"), segment(1, 1, "World."),
              {"id": 2, "type": "update", "data": {"index": 0, "text": "<Hello.> ",
                                                   "status": "translated"}},
              segment(1, 1, "World."),  # a repeat of an id taken: ignored
              {"id": 3, "type": "end", "data": {}}]
    sidecar.script["events"].append(httpx.Response(200, json={"events": events}))
    async with sidecar.client() as client:
        reading = Reading(client, "Hello. World.")
        got = [reading.reader.take(event) for event in await reading.reader.poll()]
    assert got == [TranslatedSegment(0, "Hello. ", "<Hello. >", "deadline"),
                   TranslatedSegment(1, "World.", "<World.>", "translated"),
                   SegmentUpdate(0, "<Hello.> ", "translated"), None, None]
    assert reading.reader.ended
    assert len(reading.pending) == 0 and reading.pending.next_index == 2


async def test_reader_refuses_a_segment_that_does_not_continue_the_text() -> None:
    async with FakeSidecar().client() as client:
        wrong_index = Reading(client, "One. Two.")
        with pytest.raises(SidecarError, match="segment 1 does not continue"):
            wrong_index.reader.take(segment(0, 1, "One. "))
        wrong_text = Reading(client, "One. Two.")
        with pytest.raises(SidecarError, match="segment 0 does not continue"):
            wrong_text.reader.take(segment(0, 0, "Two. "))
        for bad in ({"id": 0, "type": "segment"}, {"id": "x", "type": "end", "data": {}},
                    {"id": 0, "type": "segment", "data": {"index": 0}}, "not an event"):
            with pytest.raises(SidecarError, match="malformed event"):
                Reading(client, "One.").reader.take(bad)
    assert wrong_text.pending.next_index == 0 and len(wrong_text.pending) == 9


async def test_poll_resumes_after_the_last_id_taken() -> None:
    sidecar = FakeSidecar()
    sidecar.script["events"].append(httpx.Response(200, json={"events": [
        segment(0, 0, "One. "), segment(4, 1, "Two.")]}))
    async with sidecar.client(poll_wait_s=0.25) as client:
        reading = Reading(client, "One. Two.")
        for event in await reading.reader.poll():
            reading.reader.take(event)
        await reading.reader.poll()
    assert [s.params for s in sidecar.seen] == [{"after": "-1", "wait_ms": "250"},
                                               {"after": "4", "wait_ms": "250"}]


async def test_poll_waits_for_the_stream_to_open() -> None:
    sidecar = FakeSidecar()
    async with sidecar.client(poll_wait_s=0.01) as client:
        reading = Reading(client, opened=False)
        assert await reading.reader.poll() == []  # not open within the wait: no request
        assert sidecar.seen == []
        reading.opened.set()
        await reading.reader.poll()
    assert [s.route for s in sidecar.seen] == ["events"]


async def test_poll_gives_up_as_soon_as_the_stream_falls_back() -> None:
    sidecar = FakeSidecar()
    gate = Gate()
    sidecar.script["events"].append(gate)
    async with sidecar.client(poll_wait_s=30.0) as client:
        reading = Reading(client)
        # Waiting for the open: a fallback ends the wait, long before poll_wait_s.
        reading.opened.clear()
        waiting = asyncio.ensure_future(reading.reader.poll())
        await asyncio.sleep(0)
        reading.fallback.fail(SidecarError("the sender failed"))
        async with asyncio.timeout(10):
            assert await waiting == []
        # A request in flight is cancelled, and the poll gives nothing.
        again = Reading(client)
        polling = asyncio.ensure_future(again.reader.poll())
        async with asyncio.timeout(10):
            await gate.entered.wait()
            again.fallback.fail(SidecarError("the sender failed"))
            assert await polling == []
            await gate.cancelled.wait()


async def test_a_malformed_events_answer_is_an_error() -> None:
    sidecar = FakeSidecar()
    sidecar.script["events"].append(httpx.Response(200, json={"segments": []}))
    async with sidecar.client() as client:
        with pytest.raises(SidecarError, match="answer to the events poll is malformed"):
            await Reading(client).reader.poll()


async def test_poll_raises_once_pushed_text_has_stalled() -> None:
    sidecar = FakeSidecar()
    async with sidecar.client(stall_s=5.0, poll_wait_s=1.0) as client:
        reading = Reading(client, "Waiting.")
        reading.stall.pushed()
        reading.clock.now += 5.0
        with pytest.raises(SidecarError, match=r"no translation came back within 5 s"):
            await reading.reader.poll()
    assert sidecar.seen == []


# -- StallClock ----------------------------------------------------------------------------


def test_stall_clock_counts_from_the_later_of_push_and_result() -> None:
    clock = Clock()
    stall = StallClock(Budgets(stall_s=10.0, poll_wait_s=1.0), clock=clock)
    clock.now += 50
    assert stall.wait_s(waiting=False) == 1.0  # nothing waits: no stall, a full poll
    with pytest.raises(SidecarError, match=r"no translation came back within 10 s"):
        stall.wait_s(waiting=True)  # created 50 s ago, pushed never since
    stall.pushed()
    clock.now += 9.5
    assert stall.wait_s(waiting=True) == pytest.approx(0.5)  # the poll ends at the stall
    stall.resulted()
    clock.now += 9.0
    assert stall.wait_s(waiting=True) == 1.0
    stall.pushed()
    clock.now += 9.9
    assert stall.wait_s(waiting=True) == pytest.approx(0.1)
    clock.now += 0.1
    with pytest.raises(SidecarError, match="no translation came back within"):
        stall.wait_s(waiting=True)


# -- Fallback ------------------------------------------------------------------------------


def test_fallback_happens_once_and_tells_the_client(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="thinktrans.client")
    budgets, pending = Budgets(), PendingText()
    pending.append("secret thinking")
    fallback = Fallback(budgets, "s1", pending)
    assert not fallback.failed and fallback.reason is None
    first = SidecarError("HTTP 422 invalid-locale", status=422, slug="invalid-locale")
    assert fallback.fail(first)
    assert not fallback.fail(SidecarError("a later reason"))
    assert (fallback.failed, fallback.reason, fallback.slug) == (
        True, "HTTP 422 invalid-locale", "invalid-locale")
    assert budgets.noted == [first]
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == ("stream s1 falls back to the originals: "
                                   "HTTP 422 invalid-locale pending_chars=15")


def test_a_skip_is_logged_as_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="thinktrans.client")
    fallback = Fallback(Budgets(), "s1", PendingText())
    fallback.fail(Skipped())
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert fallback.reason == Skipped().reason


def test_the_originals_go_out_as_one_error_segment_in_order() -> None:
    pending = PendingText()
    pending.append("One. ")
    pending.give_out(5)  # segment 0 came from the sidecar
    for part in ("Two", " and", " three."):
        pending.append(part)
    fallback = Fallback(Budgets(), "s1", pending)
    fallback.fail(SidecarError("HTTP 500 internal", status=500))
    assert fallback.originals("de") == TranslatedSegment(
        1, "Two and three.", "Two and three.", "error", target="de",
        error="sidecar: HTTP 500 internal")
    assert fallback.originals("de") is None
    pending.append("Later.")
    segment = fallback.originals(None)
    assert segment is not None and (segment.index, segment.original) == (2, "Later.")


async def test_unless_failed_answers_or_gives_up_at_the_fallback() -> None:
    fallback = Fallback(Budgets(), "s1", PendingText())

    async def answer() -> str:
        return "answer"

    assert await fallback.unless_failed(answer()) == "answer"
    gate = asyncio.Event()
    cancelled = asyncio.Event()

    async def hangs() -> str:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    waiting = asyncio.ensure_future(fallback.unless_failed(hangs()))
    await asyncio.sleep(0)
    fallback.fail(SidecarError("down"))
    async with asyncio.timeout(10):
        assert await waiting is None
    assert cancelled.is_set()  # no request is left behind
    async with asyncio.timeout(10):
        await fallback.wait()  # returns at once once fallen back


# -- ThinkingStream: the parts together ----------------------------------------------------


async def test_a_reader_failure_stops_the_poster() -> None:
    """The reader finds the events malformed: the stream falls back, and what is pushed
    after goes out as it is, without another post; the stream given up is deleted."""
    sidecar = FakeSidecar()
    sidecar.script["events"].append(httpx.Response(200, json={"nope": []}))
    async with sidecar.client() as client:
        stream = client.stream("s1", target="de", flush_interval_s=0.0)
        await stream.push("First. ")
        items = stream.results()
        first = await anext(items)
        posted = len(sidecar.seen)
        await stream.push("Second.")
        second = await anext(items)
        await stream.close()
        assert [item async for item in items] == []
        await stream.aclose()
    assert stream.failure == "the sidecar's answer to the events poll is malformed"
    assert [(s.original, s.status, s.error) for s in (first, second)
            if isinstance(s, TranslatedSegment)] == [
        ("First. ", "error", "sidecar: the sidecar's answer to the events poll is malformed"),
        ("Second.", "error", "sidecar: the sidecar's answer to the events poll is malformed")]
    # Nothing posted or polled after the failure; the stream given up is deleted, once.
    assert [seen.method for seen in sidecar.seen[posted:]] == ["DELETE"]


# -- reasons in words ----------------------------------------------------------------------


def test_every_problem_the_sidecar_answers_has_words() -> None:
    """Each slug the service's table (and the guard's 401) can answer reads as what
    happened, with the status and slug after it for whoever looks further."""
    from service.exceptions import PROBLEMS

    generic = {http_reason(499, None), http_reason(599, None)}
    for kind in [*PROBLEMS.values()]:
        reason = http_reason(kind.status, kind.slug)
        assert reason.endswith(f"(HTTP {kind.status} {kind.slug})"), reason
        assert reason.startswith("the ") and reason not in generic, reason
    assert "THINKTRANS_API_TOKEN" in http_reason(401, "unauthorized")


@pytest.mark.parametrize(("status", "slug", "detail", "reason"), [
    (503, "overloaded", "the service is shutting down; open the stream on another instance",
     "the sidecar is shutting down (HTTP 503 overloaded)"),
    (503, "overloaded", "the 'local' queue is full (4096 segments); retry",
     "the sidecar's queues are full (HTTP 503 overloaded)"),
    (409, "conflict", "stream 's1' is closed; open a new stream",
     "the sidecar closed the stream before all its text was sent: it is shutting down, or "
     "another client closed the stream (HTTP 409 conflict)"),
    (418, None, "", "the sidecar refused the request (HTTP 418)"),
    (507, "", "", "the sidecar failed (HTTP 507)"),
])
def test_the_detail_tells_cases_apart_and_is_not_copied(status: int, slug: str | None,
                                                        detail: str, reason: str) -> None:
    assert http_reason(status, slug, detail) == reason


def test_transport_failures_in_words() -> None:
    assert transport_reason(httpx.ConnectError("boom")) == (
        "the sidecar is unreachable: cannot connect to it (ConnectError)")
    assert "(RuntimeError)" in transport_reason(RuntimeError())
