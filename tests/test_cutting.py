"""Cutting and deciding on their own: a fake detector and a fake submit around a cutter,
its segmenter and its emitter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.chain.work import SegmentWork, Translation
from service.ops.metrics import Metrics
from service.stream.counters import StreamCounters
from service.stream.cutting import Context, Cutter, Pacer
from service.stream.emission import Emitter, EventLog
from service.text.detect import Detection, Detector
from tests.configs import segmenter

WAIT_S = 10.0  # generous: every wait below ends on an event, long before this
GERMAN = "Der Benutzer möchte wissen, wie das Wetter morgen wird. "
UNSURE = Detection("en", 0.3, False)  # "OK.": Latin script, no clear language


class FakeDetector(Detector):
    """German, reliably, unless told otherwise; records what it was asked."""

    name = "fake"

    def __init__(self, told: dict[str, Detection] | None = None) -> None:
        self.told = told or {}
        self.asked: list[str] = []

    def detect(self, text: str) -> Detection:
        self.asked.append(text)
        return self.told.get(text.strip(), Detection("de", 0.99, True))


@dataclass
class Submitted:
    work: SegmentWork
    chain: Sequence[str]
    future: asyncio.Future[Translation]


class FakeSubmit:
    def __init__(self) -> None:
        self.calls: list[Submitted] = []

    def __call__(self, work: SegmentWork,
                 chain: Sequence[str]) -> asyncio.Future[Translation]:
        future: asyncio.Future[Translation] = asyncio.get_running_loop().create_future()
        self.calls.append(Submitted(work, chain, future))
        return future


class Counted(StreamCounters):
    """Counters that tell a run of each segment the stream's memory settled."""

    def __init__(self, told: Any) -> None:
        super().__init__(Metrics())
        self.told = told

    def memory(self, outcome: str) -> None:
        self.told(outcome)
        super().memory(outcome)


class Run:
    """A cutter wired to fakes; what it reports is recorded."""

    def __init__(self, detector: FakeDetector | None = None, *, memory_wait_s: float = 0.0,
                 context_max_chars: int = 0, deferred: bool = False, source: str | None = None,
                 deadline_s: float = 60.0) -> None:
        self.detector = detector or FakeDetector()
        self.submit = FakeSubmit()
        self.cuts: list[int] = []
        self.memory: list[str] = []
        self.settled = asyncio.Event()
        self.busy = False
        self.busy_asked = asyncio.Event()
        self.log = EventLog("s", None)
        counters = Counted(self._memory)
        self.emitter = Emitter(self.log, target="en", deadline_s=deadline_s,
                               counters=counters, on_end=lambda: None, deferred=deferred)
        self.cutter = Cutter(
            segmenter(400), self.detector, self.emitter, self.submit, chain=["fake"],
            target="en", source=source, model="m", policy="translate",
            deadline_s=deadline_s, memory_wait_s=memory_wait_s,
            context_max_chars=context_max_chars, cut=self.cuts.append,
            counters=counters, busy=self._busy, deferred=deferred,
        )

    def _memory(self, outcome: str) -> None:
        self.memory.append(outcome)
        self.settled.set()

    def _busy(self) -> bool:
        self.busy_asked.set()
        return self.busy

    async def feed(self, text: str, *, counted: bool = False, pacer: Pacer | None = None
                   ) -> None:
        await self.cutter.feed(text, pacer or Pacer(), counted=counted)

    def sent(self) -> list[tuple[str, Any]]:
        return [(c.work.text, c.work.source) for c in self.submit.calls]


async def test_each_segment_is_detected_decided_and_submitted_as_it_is_cut() -> None:
    run = Run()
    await run.feed("Der erste Satz ist hier.\n\n42 + 17 = 59\n\nDer zweite")
    assert run.sent() == [("Der erste Satz ist hier.", "de")]  # numbers are skipped
    [call] = run.submit.calls
    assert (call.work.target, list(call.chain), call.work.model) == ("en", ["fake"], "m")
    assert call.work.due is not None and call.work.due > 0
    assert call.work.index == 0 and call.work.original == "Der erste Satz ist hier.\n\n"
    assert call.future is call.work.answer  # the emitter holds the same work's answer
    assert run.cutter.pending_chars() == len("Der zweite")
    run.cutter.flush()
    assert run.sent()[-1] == ("Der zweite", "de")
    assert run.emitter.count == 3


async def test_a_named_source_is_sent_without_detection() -> None:
    run = Run(source="fr")
    await run.feed("Une phrase. ")
    run.cutter.flush()
    assert run.sent() == [("Une phrase.", "fr")] and run.detector.asked == []


async def test_counted_text_is_given_back_to_admission_as_it_is_cut() -> None:
    run = Run()
    text = "Der erste Satz. " * 400 + "Noch nicht fertig"  # over several feed slices
    await run.feed(text, counted=True)
    assert sum(run.cuts) == len(text)  # cut, or waiting in the segmenter (the stream's)
    assert len(run.cuts) > 400
    plain = Run()
    await plain.feed(text)
    assert plain.cuts == []


async def test_cutting_gives_the_loop_back_as_its_pacer_says() -> None:
    other = asyncio.Event()
    seen: list[bool] = []
    detector = FakeDetector()
    detector.detect = lambda text: (seen.append(other.is_set()),  # type: ignore[method-assign]
                                    Detection("de", 0.99, True))[1]
    run = Run(detector)
    pacer = Pacer()
    pacer.at = 0.0  # due now: it gives the loop back after the first segment
    asyncio.get_running_loop().call_soon(other.set)
    await run.feed("Der erste Satz. Der zweite Satz. Der dritte Satz. ", pacer=pacer)
    assert seen[0] is False and seen[-1] is True


async def test_a_stream_dropped_while_its_request_is_cut_stops_cutting() -> None:
    run = Run()
    pacer = Pacer()
    pacer.at = 0.0
    asyncio.get_running_loop().call_soon(run.emitter.drop)
    text = "Der erste Satz. Der zweite Satz. Der dritte Satz. "
    await run.feed(text, counted=True, pacer=pacer)
    assert run.emitter.count == 1
    assert sum(run.cuts) == len(text)  # admission still gets every place back


async def test_a_short_unclear_segment_between_two_of_the_recent_language_is_it() -> None:
    run = Run(FakeDetector({"OK.": UNSURE}), memory_wait_s=WAIT_S)
    await run.feed(GERMAN + "OK. Ich prüfe das noch einmal. ")
    run.cutter.flush()
    assert run.sent() == [(GERMAN.strip(), "de"), ("OK.", "de"),
                          ("Ich prüfe das noch einmal.", "de")]
    assert run.memory == ["kept"]


async def test_a_short_unclear_segment_before_a_switch_keeps_its_own_detection() -> None:
    switch = "Let me check the forecast once more."
    run = Run(FakeDetector({"OK.": UNSURE, switch: Detection("en", 0.99, True)}),
              memory_wait_s=WAIT_S)
    await run.feed(GERMAN + "OK. " + switch + " ")
    run.cutter.flush()
    assert run.sent() == [(GERMAN.strip(), "de")]  # "OK." and the switch: same language
    assert run.memory == ["own"]
    run.submit.calls[0].future.set_result(Translation("The user...", "fake", 0.0))
    await asyncio.sleep(0)
    statuses = [json.loads(data)["status"] for _, _, data in run.log.after(-1)]
    assert statuses == ["translated", "same_language", "same_language"]


async def test_with_memory_off_nothing_is_held() -> None:
    run = Run(FakeDetector({"OK.": UNSURE}))
    await run.feed(GERMAN + "OK. Und")
    assert run.sent() == [(GERMAN.strip(), "de"), ("OK.", "de")]  # the fallback alone
    assert run.memory == []


async def test_a_held_segment_is_settled_by_its_wait_running_out() -> None:
    run = Run(FakeDetector({"OK.": UNSURE}), memory_wait_s=0.02)
    await run.feed(GERMAN + "OK. Und")
    assert run.sent() == [(GERMAN.strip(), "de")]  # "OK." waits for the next segment
    await asyncio.wait_for(run.settled.wait(), WAIT_S)
    assert run.sent()[-1] == ("OK.", "de") and run.memory == ["kept"]


async def test_a_wait_running_out_during_a_request_is_settled_when_it_ends() -> None:
    run = Run(FakeDetector({"OK.": UNSURE}), memory_wait_s=0.02)
    run.busy = True
    await run.feed(GERMAN + "OK. Und")
    await asyncio.wait_for(run.busy_asked.wait(), WAIT_S)  # the wait ran out: left to it
    assert run.memory == []
    run.busy = False
    run.cutter.settle_overdue()
    assert run.memory == ["kept"] and run.sent()[-1] == ("OK.", "de")


async def test_a_flush_settles_the_held_segment() -> None:
    run = Run(FakeDetector({"OK.": UNSURE}), memory_wait_s=WAIT_S)
    await run.feed(GERMAN + "OK. ")
    run.cutter.flush(final=False)  # "OK." is cut, held, and nothing comes after it
    assert run.memory == ["kept"] and run.sent()[-1] == ("OK.", "de")


async def test_backends_that_use_it_get_the_preceding_text_as_context() -> None:
    run = Run(context_max_chars=30)
    await run.feed("Der erste Satz. Der zweite Satz. Der dritte Satz. ")
    run.cutter.flush()
    # at most context_max_chars, cut at a segment: the latest ones are kept
    assert [c.work.context for c in run.submit.calls] == [
        None, "Der erste Satz. ", "Der zweite Satz. "]
    plain = Run()
    await plain.feed("Der erste Satz. Der zweite Satz. ")
    plain.cutter.flush()
    assert [c.work.context for c in plain.submit.calls] == [None, None]


def test_context_keeps_the_latest_text_within_its_bound_but_always_the_last() -> None:
    context = Context(10)
    assert context.take("a" * 8) is None
    assert context.take("b" * 8) == "a" * 8
    assert context.take("c") == "b" * 8  # "a"s dropped: over the bound
    assert Context(0).take("x") is None and Context(0).take("y") is None


async def test_a_deferred_text_is_cut_whole_and_started_together() -> None:
    run = Run(FakeDetector({"OK.": UNSURE}), memory_wait_s=WAIT_S, deferred=True)
    await run.feed(GERMAN + "OK. Der letzte Satz. ")
    run.cutter.flush()
    assert run.submit.calls == []
    assert run.cutter.unstarted == 3  # "OK." was settled by the next segment
    run.cutter.start_deferred()
    assert run.cutter.unstarted == 0
    assert [text for text, _ in run.sent()] == [GERMAN.strip(), "OK.", "Der letzte Satz."]
    assert run.emitter.started
