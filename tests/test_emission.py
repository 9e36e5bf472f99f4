"""Emission on its own: the event log (readers, retention, superseded events) and the
emitter (order, the deadline, late updates, end), with futures the tests resolve."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from models.errors import BackendError
from service.chain.work import SegmentWork, Translation
from service.exceptions import EventsGone
from service.ops.metrics import Metrics
from service.schemas import SegmentResult, StreamEnd
from service.stream.counters import StreamCounters
from service.stream.emission import EMIT_BATCH, Emitter, EventLog
from service.text.decide import Decision

TRANSLATE = Decision(None, "en", "en")
SKIP = Decision("skipped", None, None)
WAIT_S = 10.0  # generous: every wait below ends on an event, long before this


def kinds(log: EventLog, after: int = -1) -> list[str]:
    return [kind for _, kind, _ in log.after(after)]


def data(log: EventLog) -> list[dict[str, object]]:
    return [json.loads(d) for _, _, d in log.after(-1)]


# -- the event log -----------------------------------------------------------------------


def test_events_get_rising_ids_and_are_read_after_a_cursor() -> None:
    log = EventLog("s", None)
    ids = [log.append("segment", f'{{"index":{i}}}') for i in range(3)]
    assert ids == [0, 1, 2]
    assert [e[0] for e in log.after(0)] == [1, 2]
    assert log.after(2) == []


def test_retention_keeps_the_last_events_and_says_when_a_reader_fell_behind() -> None:
    log = EventLog("s", 3)
    for i in range(5):
        log.append("segment", str(i))
    assert [e[0] for e in log.events] == [2, 3, 4]
    assert [e[0] for e in log.after(1)] == [2, 3, 4]  # just in time
    with pytest.raises(EventsGone, match=r"events 1\.\.1 "):
        log.after(0)


async def test_several_readers_wait_at_once_and_one_publish_wakes_them_all() -> None:
    log = EventLog("s", None)
    readers = [asyncio.create_task(log.wait(-1, WAIT_S, ended=False)) for _ in range(3)]
    await asyncio.sleep(0)  # every reader is waiting now
    assert not any(r.done() for r in readers)
    log.publish(StreamEnd(segments=0))
    got = await asyncio.wait_for(asyncio.gather(*readers), WAIT_S)
    assert [[kind for _, kind, _ in events] for events in got] == [["end"]] * 3
    late = await log.wait(-1, WAIT_S, ended=True)  # a reader joining later catches up
    assert [kind for _, kind, _ in late] == ["end"]


def test_a_superseded_event_is_skipped_by_readers_catching_up() -> None:
    log = EventLog("s", None)
    first = log.append("preview", '"Hal"')
    live = log.after(-1)  # a live reader reads the preview while it is current
    second = log.append("preview", '"Hallo"', supersedes=first)
    final = log.append("segment", '"Hallo."', supersedes=second)
    assert [e[0] for e in live] == [first]
    assert [(e[0], e[1]) for e in log.after(first)] == [(final, "segment")]
    assert [(e[0], e[1]) for e in log.after(-1)] == [(final, "segment")]  # catch-up


def test_superseded_events_take_no_place_in_retention() -> None:
    log = EventLog("s", 2)
    log.append("segment", "0")
    preview = log.append("preview", "p")
    log.append("segment", "2", supersedes=preview)
    assert [e[0] for e in log.after(-1)] == [0, 2]  # two live events: both kept
    log.append("segment", "3")
    assert [e[0] for e in log.events] == [2, 3]  # 0 dropped, and the superseded 1 with it
    with pytest.raises(EventsGone):
        log.after(-1)
    assert [e[0] for e in log.after(0)] == [2, 3]
    assert log.append("x", "-", supersedes=99) == 4  # an id not retained is left alone
    assert [e[0] for e in log.after(2)] == [3, 4]


def test_many_superseded_events_are_compacted_and_reads_stay_exact() -> None:
    log = EventLog("s", None)
    live: list[int] = []
    for i in range(100):  # three previews, each superseding the last; then the segment
        preview = log.append("preview", f"{i}a")
        for step in "bc":
            preview = log.append("preview", f"{i}{step}", supersedes=preview)
        live.append(log.append("segment", str(i), supersedes=preview))
        if i % 2 == 0:
            live.append(log.append("update", str(i)))
    assert log.next_id == 450
    assert len(log.events) <= 2 * len(live)  # the superseded ones were taken out
    assert [e[0] for e in log.after(-1)] == live
    assert [e[0] for e in log.after(live[10] - 1)] == live[10:]  # from an id taken out
    assert [e[0] for e in log.after(live[10])] == live[11:]


def test_a_one_shot_log_keeps_its_results_and_no_events() -> None:
    log = EventLog("-", None, keep_results=True)
    result = SegmentResult(index=0, original="a", text="a", source_lang=None, target="de",
                           status="skipped", backend=None, queued_ms=0, latency_ms=0)
    assert log.publish(result) == 0
    assert log.publish(StreamEnd(segments=1)) == 1
    assert log.results == [result] and not log.events


# -- the emitter ---------------------------------------------------------------------------


class Counted(StreamCounters):
    """Counters that also keep each segment result they count."""

    def __init__(self) -> None:
        super().__init__(Metrics())
        self.results: list[SegmentResult] = []

    def segment(self, result: SegmentResult) -> None:
        self.results.append(result)
        super().segment(result)


class Run:
    """An emitter with its log, recording what it reports."""

    def __init__(self, deadline_s: float = WAIT_S * 6, *, deferred: bool = False) -> None:
        self.counters = Counted()
        self.results = self.counters.results
        self.ends = 0
        self.log = EventLog("s", None)
        self.emitter = Emitter(self.log, target="de", deadline_s=deadline_s,
                               counters=self.counters, on_end=self._end, deferred=deferred)

    def _end(self) -> None:
        self.ends += 1

    def cut(self, text: str, decision: Decision = TRANSLATE, *,
            held: bool = False) -> SegmentWork:
        """A segment's work as the cutter makes it, taken by the emitter."""
        seg = SegmentWork(self.emitter.count, text, decision, time.monotonic(), "de",
                          text=text.strip(), held=held)
        self.emitter.add(seg)
        return seg

    def add(self, text: str, decision: Decision = TRANSLATE) -> SegmentWork:
        seg = self.cut(text, decision)
        if decision.status is None:
            task: asyncio.Future[Translation] = asyncio.get_running_loop().create_future()
            self.emitter.track(seg, task)
        self.emitter.advance()
        return seg

    async def until(self, count: int) -> None:
        """Wait, event-driven, until ``count`` events are out."""
        while len(self.log.events) < count:
            await asyncio.wait_for(self.log.wait(len(self.log.events) - 1, WAIT_S,
                                                 ended=False), WAIT_S)


def answer(seg: SegmentWork, text: str) -> None:
    assert seg.answer is not None
    seg.answer.set_result(Translation(text, "fake", 1.0))


async def test_segments_go_out_in_order_whatever_order_their_translations_come_in() -> None:
    run = Run()
    first, second = run.add("One. "), run.add("Two. ")
    answer(second, "Zwei.")
    await asyncio.sleep(0)  # its callback ran: it waits behind the head
    assert run.log.after(-1) == []
    answer(first, "Eins.")
    await run.until(2)
    assert [(d["index"], d["text"]) for d in data(run.log)] == [(0, "Eins. "), (1, "Zwei. ")]
    assert [r.status for r in run.results] == ["translated", "translated"]
    counted = run.counters.metrics.registry.get_sample_value(
        "thinktrans_segments_total", {"status": "translated", "backend": "fake"})
    assert counted == 2  # counted by the emitter as they went out


async def test_a_decided_segment_goes_out_at_once() -> None:
    run = Run()
    run.add("```code```", SKIP)
    assert kinds(run.log) == ["segment"]


async def test_a_missed_deadline_sends_the_original_then_an_update_then_end() -> None:
    run = Run(deadline_s=0.05)
    seg = run.add("One. ")
    await run.until(1)  # by its deadline, with nothing back
    assert data(run.log)[0]["status"] == "deadline" and data(run.log)[0]["text"] == "One. "
    run.emitter.close()
    assert run.ends == 0 and run.emitter.owed_updates == 1  # end waits for the update
    answer(seg, "Eins.")
    await run.until(3)
    assert kinds(run.log) == ["segment", "update", "end"]
    assert data(run.log)[1]["text"] == "Eins. " and run.ends == 1


async def test_a_failed_translation_goes_out_as_an_error_with_its_original() -> None:
    run = Run()
    seg = run.add("One. ")
    assert seg.answer is not None
    seg.answer.set_exception(BackendError("it broke"))
    await run.until(1)
    assert data(run.log)[0]["status"] == "error" and data(run.log)[0]["error"] == "it broke"


async def test_one_step_emits_a_batch_and_lets_the_loop_turn_before_the_rest() -> None:
    run = Run()
    held = run.add("Held. ")
    for i in range(EMIT_BATCH * 2):
        run.add(f"{i}", SKIP)
    answer(held, "Gehalten.")
    await asyncio.sleep(0)  # the head's callback: one batch goes out
    assert len(run.log.events) == EMIT_BATCH
    await run.until(EMIT_BATCH * 2 + 1)
    assert [d["index"] for d in data(run.log)] == list(range(EMIT_BATCH * 2 + 1))


async def test_a_held_segment_holds_those_behind_it_until_it_is_settled() -> None:
    run = Run(deadline_s=0.0)  # the deadline has passed already: only holding stops it
    held = run.cut("OK. ", Decision(None, "en", None), held=True)
    run.add("```x```", SKIP)
    await asyncio.sleep(0.01)
    assert run.log.after(-1) == []
    held.held, held.decision = False, Decision("same_language", "de", None)
    run.emitter.advance()
    assert [d["status"] for d in data(run.log)] == ["same_language", "skipped"]


async def test_a_deferred_emitter_starts_no_deadline_until_started() -> None:
    run = Run(deadline_s=0.0, deferred=True)
    seg = run.add("One. ")
    await asyncio.sleep(0.01)
    assert run.log.after(-1) == []  # its deadline has not begun
    run.emitter.start()
    await run.until(1)
    assert data(run.log)[0]["status"] == "deadline"
    assert seg.answer is not None and not seg.answer.done()


async def test_abort_sends_every_segment_and_owed_update_as_an_error_then_end() -> None:
    run = Run(deadline_s=0.05)
    late = run.add("One. ")
    await run.until(1)  # out at its deadline: an update owed
    run.emitter.deadline_s = WAIT_S * 6
    waiting = run.add("Two. ")
    run.emitter.abort("shut down")
    assert kinds(run.log) == ["segment", "segment", "update", "end"]
    assert [d.get("error") for d in data(run.log)[1:3]] == ["shut down", "shut down"]
    assert run.emitter.ended and run.emitter.dropped
    assert late.answer is not None and waiting.answer is not None
    assert late.answer.cancelled() and waiting.answer.cancelled()  # the work is dropped
    assert run.ends == 0  # aborted, not ended: the manager drops it


async def test_wait_emitted_returns_once_closed_and_every_segment_is_out() -> None:
    run = Run()
    seg = run.add("One. ")
    waiter = asyncio.create_task(run.emitter.wait_emitted())
    run.emitter.close()
    await asyncio.sleep(0)
    assert not waiter.done()
    answer(seg, "Eins.")
    await asyncio.wait_for(waiter, WAIT_S)
    assert kinds(run.log) == ["segment", "end"] and run.ends == 1
