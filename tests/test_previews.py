"""Previews: provisional translations of a stream's open sentence (service/stream/preview.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from models.base import Capabilities, Job
from models.errors import BackendUnavailable, Stopped
from service.chain.batcher import Batcher
from service.ops.metrics import Metrics
from service.stream.preview import mask, measure
from tests.configs import batch_limits
from tests.conftest import app_with, assert_problem, poll, post_chunks, read_until
from tests.fakes import FakeTranslator, work

LONG = ("Let me think about how the cache handles an entry that expired while a reader was "
        "still holding a reference to it, because that decides the answer. ")
# Previews come at once and at every word: the thresholds a test can watch.
EAGER: dict[str, Any] = {"preview_min_words": 3, "preview_step_words": 2,
                         "preview_interval_ms": 0, "preview_mask_k": 1, "flush_idle_ms": 5000}


@dataclass
class Previewing(FakeTranslator):
    """A fake backend that keeps each job's lane, and answers previews as told."""

    billed: bool = False
    fail_previews: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.capabilities = Capabilities(checked_output=False, billed=self.billed)

    async def run(self, job: Job) -> list[str]:
        if job.preview and self.fail_previews:
            self.jobs.append(job)
            raise BackendUnavailable("previews fail here")
        return await super().run(job)

    def previews(self) -> list[Job]:
        return [job for job in self.jobs if job.preview]


async def _stream_words(client: Any, sid: str, text: str, pause_s: float) -> list[dict[str, Any]]:
    """Post ``text`` a word at a time, reading events live as they come; close; all events
    a live reader saw, in order."""
    seen: list[dict[str, Any]] = []
    words = text.split(" ")
    for seq, word in enumerate(words):
        chunk = word if seq == len(words) - 1 else word + " "
        assert (await post_chunks(client, sid, [(seq, chunk)])).status_code == 200
        await asyncio.sleep(pause_s)
        seen += await poll(client, sid, seen[-1]["id"] if seen else -1)
    assert (await client.post(f"/v1/streams/{sid}/close")).status_code == 200
    return seen + await read_until(client, sid, after=seen[-1]["id"] if seen else -1)


def _open(previews: bool | None, sid: str = "p", target: str = "zh-CN") -> dict[str, Any]:
    body: dict[str, Any] = {"stream_id": sid, "target": target}
    if previews is not None:
        body["previews"] = previews
    return body


# -- the parts ---------------------------------------------------------------------------


def test_a_sentence_is_measured_in_words_or_in_cjk_characters() -> None:
    assert measure("Let me check the weather first") == (6, False)
    assert measure("我们先看一下天气预报") == (10, True)
    assert measure("检查 config.yaml 里的设置") == (7, True)  # Han with a Latin term: Chinese
    assert measure("the 缓存 is stale and needs a refresh") == (8, False)
    assert measure("날씨를 먼저 확인해 보자") == (10, True)  # Hangul by its syllables
    assert measure("   ") == (0, False)


def test_mask_k_leaves_off_the_last_words_or_characters() -> None:
    assert mask("the cache keeps an entry", 2, tight=False) == "the cache keeps"
    assert mask("  the cache  ", 0, tight=False) == "the cache"
    assert mask("two words", 2, tight=False) == ""
    assert mask("缓存会保留条目。", 2, tight=True) == "缓存会保留"  # the end mark goes too
    assert mask("缓存", 2, tight=True) == ""


async def test_a_segment_overtakes_previews_and_a_preview_cancelled_is_dropped_unrun() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    batcher = Batcher(fake, batch_limits(fake, max_wait_ms=0, max_batch_size=8, max_previews=2),
                      Metrics())
    await batcher.start()
    try:
        blocker = batcher.submit(work("first", "en", "zh-CN"))
        await fake.started.wait()  # the one slot is busy: what follows waits
        kept = batcher.submit_preview(work("a preview", "en", "zh-CN", preview=True))
        gone = batcher.submit_preview(work("a superseded preview", "en", "zh-CN", preview=True))
        assert kept is not None and gone is not None
        one_too_many = work("one too many", "en", "zh-CN", preview=True)
        assert batcher.submit_preview(one_too_many) is None  # its bound
        final = batcher.submit(work("a segment", "en", "zh-CN"))
        assert batcher.queue_size == 1, "previews take no place admission counts"
        gone.cancel()
        gate.set()
        await asyncio.gather(blocker, final, kept)
        assert [call.texts for call in fake.calls] == [["first"], ["a segment"], ["a preview"]]
        assert [job.preview for job in fake.jobs] == [False, False, True]
    finally:
        await batcher.stop()


@dataclass
class Stoppable(FakeTranslator):
    """A fake whose preview decodes run until their job's stop is set, then raise Stopped,
    as the local backend's do."""

    async def run(self, job: Job) -> list[str]:
        if not job.preview:
            return await super().run(job)
        self.jobs.append(job)
        self.started.set()
        assert job.stop is not None, "a preview job carries its stop signal"
        while not job.stop.is_set():
            await asyncio.sleep(0.005)
        raise Stopped("told to stop")


@pytest.mark.parametrize("slots", [1, 2])
async def test_a_segment_stops_the_preview_decode_that_holds_the_backend(slots: int) -> None:
    """With every slot held by a preview, a segment that comes tells it to stop (its future
    gets Stopped, the segment runs at once); with a slot free, the preview runs on."""
    fake = Stoppable(concurrency=slots)
    batcher = Batcher(fake, batch_limits(fake, max_wait_ms=0, max_concurrency=slots), Metrics())
    await batcher.start()
    try:
        preview = batcher.submit_preview(work("a preview", "en", "zh-CN", preview=True))
        assert preview is not None
        await fake.started.wait()
        final = await asyncio.wait_for(batcher.submit(work("a segment", "en", "zh-CN")), 60)
        assert final.text == "<zh-CN>a segment"
        [job] = [j for j in fake.jobs if j.preview]
        assert job.stop is not None and job.stop.is_set() is (slots == 1)
        if slots == 1:
            with pytest.raises(Stopped):
                await preview
        else:
            assert not preview.done()
            job.stop.set()
            with pytest.raises(Stopped):
                await preview
    finally:
        await batcher.stop()


async def test_a_segment_of_another_stream_stops_a_preview_and_it_is_counted() -> None:
    """A preview holding the local-like backend (it decodes until told to stop) does not
    hold up another stream's segment: that segment stops it, and it is counted."""
    fake = Stoppable()
    async with app_with(fake, **EAGER) as run:
        await run.client.post("/v1/streams", json=_open(True))
        await post_chunks(run.client, "p", [(0, "Let me think about how the cache")])
        await fake.started.wait()  # the preview holds the backend's one slot
        await run.client.post("/v1/streams", json=_open(False, sid="q"))
        await post_chunks(run.client, "q", [(0, "Another stream thinks too. ")])
        assert (await run.client.post("/v1/streams/q/close")).status_code == 200
        events = await read_until(run.client, "q")
        assert [e["data"]["status"] for e in events if e["type"] == "segment"] == [
            "translated"]
        assert await run.metric("thinktrans_previews_total", outcome="stopped") == 1
        assert not await poll(run.client, "p", -1), "a stopped preview is not shown"


# -- through the service -----------------------------------------------------------------


async def test_a_long_sentence_streamed_slowly_gets_previews_each_superseded_by_its_segment(
) -> None:
    fake = Previewing(delay_s=0.005)
    async with app_with(fake, **EAGER) as run:
        c = run.client
        opened = await c.post("/v1/streams", json=_open(True))
        assert opened.status_code == 201 and opened.json()["previews"] is True
        live = await _stream_words(c, "p", LONG + "Then done.", pause_s=0.03)

        previews = [e for e in live if e["type"] == "preview"]
        first = next(i for i, e in enumerate(live) if e["type"] == "segment")
        assert len(previews) >= 3 and all(live.index(p) < first for p in previews)
        assert [p["data"]["revision"] for p in previews] == list(range(1, len(previews) + 1))
        chars = [p["data"]["source_chars"] for p in previews]
        assert chars == sorted(chars) and chars[-1] <= len(LONG)
        for p in previews:
            data = p["data"]
            assert set(data) == {"index", "text", "source_chars", "revision"}  # no original
            assert data["index"] == 0
            # Mask-k: the fake's answer of that prefix, its last character left off.
            assert f"<zh-CN>{LONG[: data['source_chars']].strip()}".startswith(data["text"])
        assert fake.previews() and all(job.target == "zh-CN" for job in fake.previews())
        # The sentence's next preview is decoded towards the one shown before it.
        assert fake.previews()[0].previous == [None]
        assert fake.previews()[1].previous == [previews[0]["data"]["text"]]

        # A reader catching up sees today's stream: the segment superseded every preview.
        again = await poll(c, "p")
        assert [e["type"] for e in again] == ["segment", "segment", "end"]
        assert [e["data"] for e in again] == [e["data"] for e in live
                                               if e["type"] != "preview"]
        assert await run.metric("thinktrans_previews_total", outcome="shown") == len(previews)


async def test_previews_are_off_by_default_and_thinktrans_previews_turns_them_on() -> None:
    for server_default, asked, expected in ((False, None, False), (True, None, True),
                                            (True, False, False)):
        fake = Previewing()
        async with app_with(fake, previews=server_default, **EAGER) as run:
            opened = await run.client.post("/v1/streams", json=_open(asked))
            assert opened.json()["previews"] is expected
            live = await _stream_words(run.client, "p", LONG, pause_s=0.01)
            assert any(e["type"] == "preview" for e in live) is expected
            assert bool(fake.previews()) is expected


async def test_reopening_with_previews_otherwise_is_409() -> None:
    async with app_with(Previewing()) as run:
        assert (await run.client.post("/v1/streams", json=_open(True))).status_code == 201
        assert (await run.client.post("/v1/streams", json=_open(True))).status_code == 200
        assert_problem(await run.client.post("/v1/streams", json=_open(False)), 409, "previews")


async def test_previews_never_enter_the_cache_nor_open_the_breaker() -> None:
    fake = Previewing(fail_previews=True)
    async with app_with(fake, breaker_failures=1, **EAGER) as run:
        await run.client.post("/v1/streams", json=_open(True))
        live = await _stream_words(run.client, "p", LONG, pause_s=0.02)
        assert len(fake.previews()) >= 2, "previews were tried, and failed"
        assert not any(e["type"] == "preview" for e in live)
        assert [e["data"]["status"] for e in live if e["type"] == "segment"] == ["translated"]
        assert run.runtime.batchers["fake"].available(), "failed previews open no breaker"
        assert await run.metric("thinktrans_backend_errors_total", backend="fake",
                                error="unavailable") == 0
        assert await run.metric("thinktrans_previews_total", outcome="failed") >= 2

    fake = Previewing()
    async with app_with(fake, **EAGER) as run:
        await run.client.post("/v1/streams", json=_open(True))
        await _stream_words(run.client, "p", LONG, pause_s=0.02)
        prefixes = [job.texts[0] for job in fake.previews()]
        cache = run.runtime.cache
        assert cache is not None and len(cache) == 1, "only the segment's translation"
        answer = await run.client.post("/v1/translate", json={"texts": [prefixes[0]],
                                                               "target": "zh-CN"})
        assert answer.json()["results"][0]["segments"][0].get("cached") is None
        assert fake.calls[-1].texts == [prefixes[0]], "a prefix previewed is no cache hit"


async def test_billed_backends_are_passed_over_for_previews_unless_allowed() -> None:
    for allowed in (False, True):
        fake = Previewing(billed=True)
        async with app_with(fake, preview_billed=allowed, **EAGER) as run:
            await run.client.post("/v1/streams", json=_open(True))
            live = await _stream_words(run.client, "p", LONG, pause_s=0.02)
            assert bool(fake.previews()) is allowed
            assert any(e["type"] == "preview" for e in live) is allowed
            assert [e["data"]["status"] for e in live if e["type"] == "segment"] == [
                "translated"]
            if not allowed:
                assert await run.metric("thinktrans_previews_total",
                                        outcome="no_backend") >= 1


async def test_a_sentence_gets_at_most_preview_max_decodes_and_short_ones_none() -> None:
    fake = Previewing()
    async with app_with(fake, preview_max_decodes=2, **EAGER) as run:
        await run.client.post("/v1/streams", json=_open(True))
        text = LONG + "Short one. " + "Next " + LONG
        live = await _stream_words(run.client, "p", text.strip(), pause_s=0.01)
        prefixes = [job.texts[0] for job in fake.previews()]
        assert sum(p.startswith("Let") for p in prefixes) == 2, "two, though it grew on"
        assert sum(p.startswith("Next") for p in prefixes) == 2
        assert not any(p.startswith("Short") for p in prefixes), "two words: none"
        shown = [e["data"]["index"] for e in live if e["type"] == "preview"]
        assert set(shown) <= {0, 2} and len(shown) <= 4


async def test_code_and_the_targets_own_language_get_no_preview() -> None:
    fake = Previewing()
    async with app_with(fake, **EAGER) as run:
        await run.client.post("/v1/streams", json=_open(True, target="en"))
        await _stream_words(run.client, "p", LONG, pause_s=0.01)  # English to English
        await run.client.post("/v1/streams", json=_open(True, sid="code"))
        fence = "```python\nfor item in items: total = total + item.price * item.count\n```\n"
        await _stream_words(run.client, "code", fence, pause_s=0.01)
        assert fake.previews() == []


# -- the same stream with previews or without ---------------------------------------------

_WORDS = st.sampled_from(["the", "cache", "expired", "entry", "reader", "config.yaml",
                          "`x = 1`", "缓存", "条目", "Hmm,", "OK.", "then.", "so?", "\n"])


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(words=st.lists(_WORDS, min_size=1, max_size=40), chunk=st.integers(1, 9))
@example(words=LONG.split(), chunk=6)
def test_previews_change_no_segment_status_or_original(words: Sequence[str], chunk: int) -> None:
    text = " ".join(words)
    shown: list[int] = []
    chunks = list(enumerate(text[i:i + chunk] for i in range(0, len(text), chunk)))

    async def run_once(previews: bool) -> list[tuple[Any, ...]]:
        async with app_with(Previewing(), **EAGER) as run:
            await run.client.post("/v1/streams", json=_open(previews))
            for seq, part in chunks:
                await post_chunks(run.client, "p", [(seq, part)])
                await asyncio.sleep(0.002)
            await run.client.post("/v1/streams/p/close")
            events = await read_until(run.client, "p")
            shown.append(int(await run.metric("thinktrans_previews_total", outcome="shown")))
        return [(s["index"], s["original"], s["status"], s["text"])
                for s in (e["data"] for e in events if e["type"] == "segment")]

    async def both() -> None:
        assert await run_once(True) == await run_once(False)
        if list(words) == LONG.split():
            assert shown[0] >= 2 and shown[1] == 0, "previews were made, and only when asked"

    asyncio.run(both())


@pytest.mark.parametrize("target", ["zh-CN", "de"])
async def test_a_deadline_segment_supersedes_its_previews_and_its_update_follows(
        target: str) -> None:
    gate = asyncio.Event()
    fake = Previewing(gate=gate)
    async with app_with(fake, deadline_ms=200, **EAGER) as run:
        await run.client.post("/v1/streams", json=_open(True, target=target))
        await post_chunks(run.client, "p", [(0, "Let me think about the cache ")])
        await asyncio.wait_for(fake.started.wait(), 60)  # the preview holds the backend
        assert (await poll(run.client, "p", wait_ms=0)) == []
        await post_chunks(run.client, "p", [(1, "entry now. Next")])
        await run.client.post("/v1/streams/p/close")
        events = await read_until(run.client, "p", "segment", count=2)
        assert [e["data"]["status"] for e in events] == ["deadline", "deadline"]
        gate.set()
        rest = await read_until(run.client, "p", after=events[-1]["id"])
        assert [e["type"] for e in rest] == ["update", "update", "end"]  # no preview after
        assert fake.jobs[0].preview and not fake.jobs[1].preview
        assert await run.metric("thinktrans_previews_total", outcome="superseded") == 1


async def test_a_sentence_short_of_the_length_gets_its_preview_once_old_enough() -> None:
    fake = Previewing()
    overrides = {**EAGER, "preview_min_words": 100, "preview_after_ms": 150}
    async with app_with(fake, **overrides) as run:
        await run.client.post("/v1/streams", json=_open(True))
        await post_chunks(run.client, "p", [(0, "Let me think")])
        await asyncio.sleep(0.05)
        assert fake.previews() == [], "neither long nor old enough yet"
        # Nothing more comes: the stream's own timer makes the preview.
        events = await read_until(run.client, "p", "preview")
        assert events[-1]["data"] == {"index": 0, "text": "<zh-CN>Let me thin",
                                      "source_chars": 12, "revision": 1}
        assert [job.texts for job in fake.previews()] == [["Let me think"]]


async def test_a_sentence_held_only_for_what_follows_its_end_gets_no_preview() -> None:
    """Text that ends as a sentence ends waits in the segmenter only for the next text,
    which cuts it: a preview then would hold up its segment, so none is made."""
    fake = Previewing()
    async with app_with(fake, **EAGER) as run:
        await run.client.post("/v1/streams", json=_open(True))
        await post_chunks(run.client, "p", [(0, "Let me check the numbers again. ")])
        await asyncio.sleep(0.2)  # held: the next text cuts it
        await post_chunks(run.client, "p", [(1, "Then I look at how the parser reads it")])
        await asyncio.sleep(0.2)
        prefixes = [job.texts[0] for job in fake.previews()]
        assert prefixes and all(p.startswith("Then") for p in prefixes), prefixes
