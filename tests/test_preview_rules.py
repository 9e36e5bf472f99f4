"""Two rules of previews (service/stream/preview.py), each seen to hold where breaking it
would show: a preview that lost a protected span is never shown, and a segment that goes
out at its deadline supersedes the previews of its sentence that were published."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from models.base import Job
from tests.conftest import Running, app_with, poll, post_chunks, read_until
from tests.fakes import FakeTranslator

# A preview at once and at every second word, its last word masked; no idle flush.
EAGER: dict[str, Any] = {"preview_min_words": 3, "preview_step_words": 2,
                         "preview_interval_ms": 0, "preview_mask_k": 1, "flush_idle_ms": 5000}
SPAN = "`make test`"
# Every prefix a preview is made of holds the whole span: it comes in the first chunk.
OPENING = f"Run {SPAN} first and then look at"
REST = " how the cache handles an entry that expired".split(" ")[1:]
# Long enough for a hang to fail the test, never what it measures.
HANG_S = 60.0


@dataclass
class SpanDropping(FakeTranslator):
    """A fake whose preview answers keep the span (``drop_span`` off) or lose its backticks
    (on); its segments' answers keep it."""

    drop_span: bool = False

    async def run(self, job: Job) -> list[str]:
        answers = await super().run(job)
        if job.preview and self.drop_span:
            return [answer.replace(SPAN, "make test") for answer in answers]
        return answers

    def previews(self) -> list[Job]:
        return [job for job in self.jobs if job.preview]


async def _outcomes(run: Running, *names: str) -> float:
    return sum([await run.metric("thinktrans_previews_total", outcome=name) for name in names])


async def _until_a_preview_is_answered(run: Running) -> None:
    """Wait until the stream's preview came back and was shown or refused."""
    give_up = asyncio.get_running_loop().time() + HANG_S
    while not await _outcomes(run, "shown", "failed"):
        assert asyncio.get_running_loop().time() < give_up, "no preview came back"
        await asyncio.sleep(0.01)


async def _stream(run: Running) -> list[dict[str, Any]]:
    """The opening with its span, then a word at a time; closed. Every event a live reader
    saw: one that reads once the first preview is back, and again after each word."""
    c = run.client
    opened = await c.post("/v1/streams", json={"stream_id": "p", "target": "zh-CN",
                                               "previews": True})
    assert opened.status_code == 201, opened.text
    assert (await post_chunks(c, "p", [(0, OPENING)])).status_code == 200
    await _until_a_preview_is_answered(run)
    seen = await poll(c, "p")
    for seq, word in enumerate(REST, start=1):
        assert (await post_chunks(c, "p", [(seq, " " + word)])).status_code == 200
        seen += await poll(c, "p", seen[-1]["id"] if seen else -1)
    assert (await c.post("/v1/streams/p/close")).status_code == 200
    return seen + await read_until(c, "p", after=seen[-1]["id"] if seen else -1,
                                   timeout_s=HANG_S)


async def test_a_preview_that_lost_a_protected_span_is_never_shown() -> None:
    # The same stream, its previews keeping the span: they are shown.
    kept = SpanDropping()
    async with app_with(kept, **EAGER) as run:
        events = await _stream(run)
        shown = [e["data"] for e in events if e["type"] == "preview"]
        assert shown and all(SPAN in p["text"] for p in shown), events
        assert await _outcomes(run, "failed") == 0

    # Its previews losing the span: made, answered, and none shown.
    lost = SpanDropping(drop_span=True)
    async with app_with(lost, **EAGER) as run:
        events = await _stream(run)
        assert lost.previews(), "previews were made"
        assert all(SPAN in job.texts[0] for job in lost.previews())
        assert [e["type"] for e in events] == ["segment", "end"], events
        [segment] = [e["data"] for e in events if e["type"] == "segment"]
        assert segment["status"] == "translated" and SPAN in segment["text"]
        assert await _outcomes(run, "failed") >= 1
        assert await _outcomes(run, "shown") == 0


@dataclass
class HeldSegments(FakeTranslator):
    """A fake that answers previews at once and holds segments until ``release``."""

    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, job: Job) -> list[str]:
        if not job.preview:
            await self.release.wait()
        return await super().run(job)


async def test_a_segment_out_at_its_deadline_supersedes_its_published_previews() -> None:
    fake = HeldSegments()
    try:
        async with app_with(fake, deadline_ms=200, **EAGER) as run:
            c = run.client
            await c.post("/v1/streams", json={"stream_id": "p", "target": "zh-CN",
                                              "previews": True})
            await post_chunks(c, "p", [(0, "Let me think about the cache entry ")])
            live = await read_until(c, "p", "preview", timeout_s=HANG_S)
            [preview] = [e for e in live if e["type"] == "preview"]
            assert preview["data"]["index"] == 0

            # The sentence ends; its translation is held, so it goes out at its deadline.
            await post_chunks(c, "p", [(1, "now. Next")])
            live += await read_until(c, "p", "segment", after=live[-1]["id"],
                                     timeout_s=HANG_S)
            segment = live[-1]
            assert segment["type"] == "segment" and segment["id"] > preview["id"]
            assert segment["data"]["index"] == 0
            assert segment["data"]["status"] == "deadline"

            # A reader catching up sees the segment, not the preview it superseded.
            again = await poll(c, "p")
            assert [(e["type"], e["data"]["index"]) for e in again] == [("segment", 0)]
            assert again[0]["id"] == segment["id"]

            # Its update follows once the translation is back; still no preview.
            await c.post("/v1/streams/p/close")
            fake.release.set()
            rest = await read_until(c, "p", after=segment["id"], timeout_s=HANG_S)
            assert "preview" not in [e["type"] for e in rest]
            updates = [e["data"] for e in rest if e["type"] == "update"]
            assert updates[0]["index"] == 0 and updates[0]["status"] == "translated"
            assert "preview" not in [e["type"] for e in await poll(c, "p")]
            assert await run.metric("thinktrans_previews_total", outcome="shown") == 1
    finally:
        fake.release.set()
