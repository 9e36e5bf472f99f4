"""Bursts, abuse and lost readers inside the documented limits: the service stays up,
bounded and in order.

Each test here pins one class of defect: a chunk POST that queued far past the queue's
bound and wedged the loop with per-segment retries; ended streams that kept everything
until they expired; SSE data that line splitters cut; cutting and detecting a large
request that held every other stream; stream ids no client can address.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from tests.conftest import (
    InThread,
    app_with,
    assert_problem,
    check_stream,
    poll,
    post_chunks,
    read_until,
    segments,
    sse_events,
)
from tests.fakes import FakeTranslator

SSE = {"Accept": "text/event-stream"}


@dataclass
class Lag:
    """The longest the event loop was held (``worst``) while a block ran for ``total``
    seconds."""

    worst: float = 0.0
    total: float = 0.0

    def check(self, bound_s: float) -> None:
        """Held no longer than ``bound_s``, or, where a loaded machine makes every turn
        slow, no longer than a quarter of the block: work that holds the loop throughout
        fails both."""
        assert self.worst < bound_s or self.worst < self.total / 4, (
            f"the event loop was held for {self.worst:.2f} s of {self.total:.2f} s")


@asynccontextmanager
async def loop_lag() -> AsyncIterator[Lag]:
    """How long the event loop was held, seen by a task that asks every 5 ms."""
    lag = Lag()
    # As `thinktrans serve` does once started: what the process holds already (in a test
    # run, every earlier test's leftovers) is left out of the collector's full passes.
    gc.collect()
    gc.freeze()

    async def tick() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.005)
            lag.worst = max(lag.worst, time.monotonic() - before - 0.005)

    task = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    started = time.monotonic()
    try:
        yield lag
    finally:
        await asyncio.sleep(0.02)  # the tick that spanned the last hold reports it
        lag.total = time.monotonic() - started
        task.cancel()
        gc.unfreeze()


# -- a burst past the queue ------------------------------------------------------------------

SHORT = "Short one here. "  # one segment per 16 characters, each needing translation
CHUNK = SHORT * 1024  # 16 KiB: the default THINKTRANS_MAX_CHUNK_CHARS


async def test_a_burst_past_the_queue_takes_what_fits_and_loses_nothing() -> None:
    """Four 16 KiB chunks of short sentences (4096 segments) into a 64-place queue while
    the backend is stuck: the POST takes what fits and says so with 503 and
    accepted_through; the loop stays free (no retry storm); once the backend moves, the
    client resends from there and every segment comes out, translated, in order."""
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate, concurrency=1)
    async with app_with(fake, default_locale="de", max_queue_size=64, deadline_ms=60_000,
                        max_batch_size=32) as run:
        c = run.client
        await post_chunks(c, "b", [(0, "Warm up the backend now. ")])
        await asyncio.wait_for(fake.started.wait(), 60)  # a batch in flight, stuck
        chunks = [(seq, CHUNK) for seq in range(1, 5)]
        async with loop_lag() as lag:
            # Answered with the backend still stuck: it waits for no place in the queue.
            r = await asyncio.wait_for(post_chunks(c, "b", chunks), 60)
            body = assert_problem(r, 503, "resend from seq 2")
            assert int(r.headers["Retry-After"]) >= 1
            assert body["accepted_through"] == 1  # the first chunk went in, nothing after
            depth = await run.metric("thinktrans_queue_depth", backend="fake")
            assert 64 <= depth <= 64 + len(CHUNK) // len(SHORT), depth  # one chunk past
            for _ in range(20):  # refused while full: nothing more is taken, quickly
                again = await post_chunks(c, "b", chunks[1:])
                assert again.status_code == 503 and again.json()["accepted_through"] == 1
            assert (await c.get("/healthz")).status_code == 200
        lag.check(0.5)
        # One deadline timer per stream, and no retry timer per segment.
        timers = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
        assert len(timers) < 50, len(timers)
        gate.set()
        todo = chunks[1:]
        give_up = time.monotonic() + 60
        while todo:
            assert time.monotonic() < give_up, "the queue never drained"
            r = await post_chunks(c, "b", todo)
            if r.status_code == 503:
                through = r.json()["accepted_through"]
                todo = [(seq, text) for seq, text in todo if seq > through]
                await asyncio.sleep(0.05)
                continue
            assert r.json() == {"accepted_through": 4}
            todo = []
        assert (await c.post("/v1/streams/b/close")).status_code == 200
        events = await read_until(c, "b", timeout_s=60)
        check_stream(events, "Warm up the backend now. " + CHUNK * 4)
        assert {s["status"] for s in segments(events)} == {"translated"}


async def test_streams_bursting_together_overshoot_the_queue_by_one_chunk_at_most() -> None:
    """Eight streams post four 16 KiB chunks each at once: text accepted and not cut yet
    counts against everyone's room, so the queue runs past its bound by one chunk's
    segments at most, not one per stream."""
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate, concurrency=1)
    async with app_with(fake, default_locale="de", max_queue_size=1500, deadline_ms=60_000,
                        max_batch_size=32) as run:
        c = run.client
        dispatcher = run.runtime.dispatcher
        batcher = dispatcher.batchers["fake"]
        await post_chunks(c, "warm", [(0, "Warm up the backend now. ")])
        await asyncio.wait_for(fake.started.wait(), 60)
        deepest = 0

        async def watch() -> None:
            nonlocal deepest
            while True:
                deepest = max(deepest, batcher.queue_size)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        chunks = [(seq, CHUNK) for seq in range(4)]
        answers = await asyncio.gather(*(post_chunks(c, f"s{i}", chunks) for i in range(8)))
        watcher.cancel()
        assert deepest <= 1500 + len(CHUNK) // len(SHORT) + 1, deepest
        assert all(r.status_code == 503 for r in answers)
        assert run.runtime.admission.uncut == 0


async def test_a_request_on_a_full_queue_accepts_nothing() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="de", max_queue_size=4, max_batch_size=1,
                        deadline_ms=60_000) as run:
        c = run.client
        await post_chunks(c, "a", [(0, "One is here. Two is here. Three. Four. Five. Six. ")])
        await asyncio.wait_for(fake.started.wait(), 60)
        r = await post_chunks(c, "other", [(0, "Seven is here. ")])
        assert assert_problem(r, 503)["accepted_through"] == -1
        assert (await post_chunks(c, "other", [])).json() == {"accepted_through": -1}


async def test_cancelled_work_gives_its_places_back() -> None:
    """Deleting a stream with queued segments frees their places: a new stream fits."""
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with app_with(fake, default_locale="de", max_queue_size=8, max_batch_size=1,
                        deadline_ms=60_000) as run:
        c = run.client
        await post_chunks(c, "gone", [(0, "A one here. " * 12)])
        await asyncio.wait_for(fake.started.wait(), 60)
        assert await run.metric("thinktrans_queue_depth", backend="fake") >= 8
        assert (await c.delete("/v1/streams/gone")).status_code == 204
        for _ in range(3):  # the cancellations' callbacks run on the loop's next turns
            await asyncio.sleep(0)
        assert await run.metric("thinktrans_queue_depth", backend="fake") == 0
        assert (await post_chunks(c, "new", [(0, "Fits now. ")])).status_code == 200


# -- ended streams are bounded ----------------------------------------------------------------

async def _ended(c: httpx.AsyncClient, sid: str, text: str) -> None:
    await post_chunks(c, sid, [(0, text)])
    assert (await c.post(f"/v1/streams/{sid}/close")).status_code == 200
    await read_until(c, sid)


async def test_ended_streams_past_the_count_are_evicted_oldest_first_and_read_410() -> None:
    async with app_with(default_locale="de", max_ended_streams=3) as run:
        c = run.client
        for i in range(5):
            await _ended(c, f"s{i}", f"Stream number {i} is done. ")
        for i in (0, 1):
            body = assert_problem(await c.get(f"/v1/streams/s{i}/events"), 410,
                                  "evicted", "THINKTRANS_MAX_ENDED_STREAMS=3")
            assert body["evicted"] is True
            assert_problem(await post_chunks(c, f"s{i}", [(1, "more")]), 410, "evicted")
        for i in (2, 3, 4):
            assert segments(await poll(c, f"s{i}"))[0]["original"].startswith("Stream")
        assert await run.metric("thinktrans_ended_streams") == 3
        assert await run.metric("thinktrans_streams_evicted_total") == 2
        assert await run.metric("thinktrans_open_streams") == 0
        # The id may be opened again, as a new stream.
        assert (await c.post("/v1/streams", json={"stream_id": "s0"})).status_code == 201
        assert await poll(c, "s0") == []


async def test_ended_streams_past_the_byte_bound_are_evicted() -> None:
    text = "A sentence of some length to keep around. " * 50  # 50 events, ~25 KB
    async with app_with(default_locale="de", max_ended_bytes=60_000) as run:
        c = run.client
        for i in range(4):
            await _ended(c, f"b{i}", text)
        kept = await run.metric("thinktrans_ended_stream_bytes")
        assert 40_000 < kept <= 60_000
        assert_problem(await c.get("/v1/streams/b0/events"), 410, "THINKTRANS_MAX_ENDED_BYTES")
        assert (await c.get("/v1/streams/b3/events")).status_code == 200
        assert await run.metric("thinktrans_ended_streams") == 2


async def test_open_streams_are_not_evicted_and_a_deleted_one_is_404() -> None:
    async with app_with(default_locale="de", max_ended_streams=0) as run:
        c = run.client
        await post_chunks(c, "open", [(0, "Still going. ")])
        await _ended(c, "done", "Finished. ")
        assert_problem(await c.get("/v1/streams/done/events"), 410)
        assert (await c.get("/v1/streams/open/events")).status_code == 200
        assert (await c.delete("/v1/streams/open")).status_code == 204
        assert_problem(await c.get("/v1/streams/open/events"), 404)


async def test_a_reader_following_a_stream_gets_its_end_even_when_it_is_evicted() -> None:
    with InThread(default_locale="de", max_ended_streams=0) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            await post_chunks(c, "live", [(0, "Read me as I go. ")])
            async with c.stream("GET", "/v1/streams/live/events", headers=SSE) as r:
                events = sse_events(r)
                assert (await asyncio.wait_for(anext(events), 60))["type"] == "segment"
                await c.post("/v1/streams/live/close")
                assert (await asyncio.wait_for(anext(events), 60))["type"] == "end"
            assert_problem(await c.get("/v1/streams/live/events"), 410)


# -- SSE line ends ---------------------------------------------------------------------------

async def test_sse_data_with_unicode_line_ends_reaches_line_splitting_readers_whole() -> None:
    """U+2028, U+2029 and U+0085 are line ends to str.splitlines and httpx's aiter_lines:
    raw inside the JSON of a `data:` line, they cut the event in two."""
    text = "Line\u2028separated. Para\u2029graph. Next\x85line. Form\x0cfeed. Group\x1dsep. "
    async with app_with(default_locale="de") as run:
        c = run.client
        await post_chunks(c, "u", [(0, text)])
        await c.post("/v1/streams/u/close")
        async with c.stream("GET", "/v1/streams/u/events", headers=SSE) as r:
            body = (await r.aread()).decode()
        lines = body.splitlines()
        data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        assert "".join(d["original"] for d in data if "original" in d) == text
        assert all(line.startswith(("id: ", "event: ", "data: ", ":")) or not line
                   for line in lines), lines


# -- CPU-heavy requests give the loop back ------------------------------------------------------

async def test_a_large_same_language_post_does_not_hold_other_streams() -> None:
    """Ten 16 KiB chunks of '好。' (81,920 segments, nothing to translate) in one POST."""
    async with app_with(default_locale="zh-CN", max_request_bytes=2_000_000) as run:
        c = run.client
        chunks = [(seq, "好。" * 8192) for seq in range(10)]
        async with loop_lag() as lag:
            r = await post_chunks(c, "big", chunks)
        assert r.json() == {"accepted_through": 9}
        lag.check(0.25)
        await c.post("/v1/streams/big/close")
        events = await read_until(c, "big", after=81_900, timeout_s=60)
        assert events[-1]["data"] == {"segments": 81_920}


async def test_detecting_long_unspaced_texts_is_quick_and_gives_the_loop_back() -> None:
    """A run without spaces once cost quadratic time in an e-mail pattern (minutes)."""
    texts = ["x" * 100_000, "好" * 100_000, "a@" * 50_000, "Plain English words here. " * 3800]
    async with app_with(max_request_bytes=2_000_000) as run:
        async with loop_lag() as lag:
            # Minutes, were it quadratic; a loaded machine takes seconds.
            r = await asyncio.wait_for(run.client.post("/v1/detect", json={"texts": texts}), 60)
        assert r.status_code == 200
        langs = [d["lang"] for d in r.json()["results"]]
        assert langs[1] == "zh-Hans" and langs[3] == "en"
        lag.check(0.25)


# -- stream ids ------------------------------------------------------------------------------

async def test_dot_segment_stream_ids_are_refused() -> None:
    async with app_with() as run:
        c = run.client
        for sid in (".", ".."):
            body = assert_problem(await c.post("/v1/streams", json={"stream_id": sid}), 422)
            assert "could never be reached" in json.dumps(body)
            # Percent-encoded, a client can send them; the service still refuses them.
            r = await c.post("/v1/streams/%2E" + ("%2E" if sid == ".." else "") + "/chunks",
                             json={"chunks": [{"seq": 0, "text": "x"}]})
            assert_problem(r, 422)
        for sid in ("...", ".a", "a.."):
            assert (await c.post("/v1/streams", json={"stream_id": sid})).status_code == 201
