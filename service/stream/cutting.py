"""Cutting and deciding: a stream's text into segments, each detected, decided and started.

A segment is submitted the moment it is cut, so its translation starts while the thinking
goes on. Short segments of unclear language ("OK.", "Hmm,") are read by the stream's
language memory, its recent reliable language, which a detector alone cannot know.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from models.spans import Protected
from service.chain.work import SegmentWork, Translation
from service.schemas import Policy
from service.stream.counters import StreamCounters
from service.stream.emission import Emitter
from service.text.decide import Decision, decide, leans_on_memory, settled_memory, wants_detection
from service.text.detect import Detection, Detector
from service.text.segmenter import Piece, Segmenter

# Accepted text is cut this much at a time (a request's text, or this much of it).
FEED_BATCH_CHARS = 4096
# Cutting and detecting a large request gives the event loop back this often, so that
# other streams' deadlines and /healthz never wait long behind it.
YIELD_EVERY_S = 0.01


class Pacer:
    """One request's CPU-heavy work (cutting, detecting) gives the event loop back every
    YIELD_EVERY_S, so that no other stream's deadline or /healthz waits long behind it."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = time.monotonic() + YIELD_EVERY_S  # when to give the loop back next

    async def breathe(self) -> None:
        if time.monotonic() >= self.at:
            await self.pause()

    async def pause(self) -> None:
        await asyncio.sleep(0)
        self.at = time.monotonic() + YIELD_EVERY_S


class Submit(Protocol):
    """Starts one segment's work down a chain (``Dispatcher.submit``)."""

    def __call__(self, work: SegmentWork,
                 chain: Sequence[str]) -> asyncio.Future[Translation]: ...


@dataclass(eq=False, slots=True)
class _Held:
    """The segment waiting for the next one to settle its language: its detection, and
    the stream's recent language when it was cut."""

    work: SegmentWork
    detection: Detection
    memory: str | None


class Context:
    """The stream's latest segments' text, at most ``max_chars`` (but always the last
    one), for backends that translate better with it; ``max_chars`` 0: none kept."""

    __slots__ = ("_chars", "_parts", "max_chars")

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._parts: deque[str] = deque()
        self._chars = 0

    def take(self, text: str) -> str | None:
        """The text before this segment's (None: none, or not kept), then remember it."""
        if not self.max_chars:
            return None
        parts = self._parts
        context = "".join(parts) or None
        parts.append(text)
        self._chars += len(text)
        while len(parts) > 1 and self._chars > self.max_chars:
            self._chars -= len(parts.popleft())
        return context


class Cutter:
    """A stream's text into decided segments, handed to its ``Emitter`` and started.

    Of each segment's ``SegmentWork`` the cutter writes only its own fields: the decision
    (a held one's settled later), context, spans and ``due``.

    ``cut``: told how many accepted characters each step cut (admission's uncut count);
    ``counters``: counts how each held segment was settled (``kept``: the recent language;
    ``own``: its own detection); ``busy``: whether a request is cutting the stream now
    (a held segment's wait running out then leaves it to that request).
    """

    def __init__(self, segmenter: Segmenter, detector: Detector, emitter: Emitter,
                 submit: Submit, *, chain: Sequence[str], target: str | None,
                 source: str | None, model: str | None, policy: Policy, deadline_s: float,
                 memory_wait_s: float, context_max_chars: int, cut: Callable[[int], None],
                 counters: StreamCounters, busy: Callable[[], bool],
                 deferred: bool = False,
                 protect: Callable[[str], Protected | None] | None = None) -> None:
        self.segmenter = segmenter
        self._detector = detector
        self._emitter = emitter
        self._submit = submit
        self._chain = chain
        self.target = target
        self.source = source  # the request's own source language (one-shot only)
        self.model = model
        self.policy: Policy = policy
        self._deadline_s = deadline_s
        # A held segment waits at most half its deadline, leaving the rest to translate it.
        self._memory_wait_s = min(memory_wait_s, deadline_s / 2)
        self._context = Context(context_max_chars)
        self._cut = cut
        self._counters = counters
        self._busy = busy
        self._protect = protect  # a segment's text -> its protected spans (None: none)
        self.recent_lang: str | None = None
        # At most one segment waits for the next one to settle its language (memory).
        self._held: _Held | None = None
        self._held_timer: asyncio.TimerHandle | None = None
        # The held segment whose wait ran out while a request was cutting.
        self._memory_overdue: _Held | None = None
        # One-shot: segments are cut first and started together, after admission.
        self._unstarted: list[SegmentWork] | None = [] if deferred else None

    # -- text in ---------------------------------------------------------------------------

    async def feed(self, text: str, pacer: Pacer, *, counted: bool) -> None:
        """Cut, detect and start ``text``'s segments, giving the event loop back as the
        request's pacer says: a large request never holds other streams up for long.
        ``counted``: the text is in admission's uncut count until each slice is cut."""
        cut = self._cut
        emitter = self._emitter
        left = len(text) if counted else 0  # still counted uncut
        try:
            for start in range(0, len(text), FEED_BATCH_CHARS):
                part = text[start : start + FEED_BATCH_CHARS]
                slice_left = len(part) if counted else 0
                for piece in self.segmenter.feed(part):
                    self._add(piece)
                    if slice_left:  # its characters are queued (or decided) now
                        taken = min(len(piece.text), slice_left)
                        slice_left -= taken
                        left -= taken
                        cut(taken)
                    if time.monotonic() >= pacer.at:  # checked inline: no coroutine a piece
                        await pacer.pause()
                        if emitter.dropped:
                            return  # deleted while this request was cut: nobody reads it
                if slice_left:  # the rest waits in the segmenter, counted by its stream
                    left -= slice_left
                    cut(slice_left)
        finally:
            if left:
                cut(left)

    def preview_work(self, text: str, previous: str | None) -> SegmentWork | None:
        """The work of a preview of the open sentence ``text``, decided as it would be were
        it cut now (``previous``: its last preview as shown); None: it would not be
        translated (code, the target's language, hidden, no target)."""
        if self.target is None or self._unstarted is not None or not wants_detection(
                text, "text"):
            return None
        detection = None if self.source is not None else self._detector.detect(text)
        decision = decide(True, target=self.target, detection=detection,
                          fallback_lang=self.recent_lang, source=self.source,
                          policy=self.policy)
        if decision.status is not None:
            return None
        core = text.strip()
        return SegmentWork(self._emitter.count, text, decision, time.monotonic(), self.target,
                           text=core, model=self.model, preview=True, previous=previous,
                           protected=self._protect(core) if self._protect is not None else None)

    def pending_chars(self) -> int:
        """Characters fed and not cut into a segment yet."""
        return len(self.segmenter.pending)

    def pending(self) -> str:
        """The text fed and not cut into a segment yet: the sentence still open."""
        return self.segmenter.pending

    def flush(self, *, final: bool = True) -> None:
        """Make whatever text is pending a segment (idle: ``final=False``, or close), and
        settle a segment waiting for the next one: nothing more is coming now."""
        for piece in self.segmenter.flush(final=final):
            self._add(piece)
        if self._held is not None:
            self._settle(None)

    def _add(self, piece: Piece) -> None:
        detection = None
        prose = wants_detection(piece.text, piece.kind)
        if prose and self.source is None:
            detection = self._detector.detect(piece.text)
            if self._held is not None:  # this segment settles the one before it
                self._settle(detection.lang if detection.reliable else None)
            if (self._memory_wait_s > 0 and self.target is not None
                    and leans_on_memory(detection, self.recent_lang)):
                self._hold(piece, detection)
                return
            if detection.reliable and detection.lang:
                self.recent_lang = detection.lang
        decision = decide(prose, target=self.target, detection=detection,
                          fallback_lang=self.recent_lang, source=self.source,
                          policy=self.policy)
        seg = self._cut_segment(piece, decision)
        if decision.status is None:
            self._begin(seg)
        self._emitter.advance()

    def _cut_segment(self, piece: Piece, decision: Decision, *,
                     held: bool = False) -> SegmentWork:
        """The segment's work, made once, ready now, taken by the emitter as the next."""
        seg = SegmentWork(self._emitter.count, piece.text, decision, time.monotonic(),
                          self.target, text=piece.text.strip(), model=self.model, held=held)
        self._emitter.add(seg)
        return seg

    # -- stream memory -----------------------------------------------------------------------

    def _hold(self, piece: Piece, detection: Detection) -> None:
        """Cut a segment whose language only the stream's memory can tell, and let it wait
        (at most ``_memory_wait_s``) for the next segment: see ``_settle``."""
        seg = self._cut_segment(piece, Decision(None, detection.lang, None), held=True)
        self._held = _Held(seg, detection, self.recent_lang)
        if self._unstarted is None:  # a one-shot text is settled when it is all cut
            self._held_timer = asyncio.get_running_loop().call_later(
                self._memory_wait_s, self._on_memory_wait)
        self._emitter.advance()

    def _settle(self, next_lang: str | None) -> None:
        """Decide the held segment: between two segments of the stream's recent language
        it is that language; before a segment reliably in another language (a switch) it
        is what its own detection says; with no clear next language (the wait ran out, a
        flush, an unclear next segment) it is the recent language, as it always was."""
        held, self._held = self._held, None
        assert held is not None
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        memory = settled_memory(held.memory, next_lang)
        seg = held.work
        seg.held = False
        seg.decision = decide(True, target=self.target, detection=held.detection,
                              fallback_lang=memory, policy=self.policy)
        self._counters.memory("kept" if memory else "own")
        if seg.decision.status is None:
            self._begin(seg)  # no segment after it has taken its context yet
        self._emitter.advance()

    def _on_memory_wait(self) -> None:
        self._held_timer = None
        if self._held is None or self._emitter.dropped:
            return
        if self._busy():
            # A request is cutting this stream: its next segment may be in it. It settles
            # the held one, or the request's end does (``settle_overdue``).
            self._memory_overdue = self._held
            return
        self._settle(None)

    def settle_overdue(self) -> None:
        """At a request's end: settle the held segment whose wait ran out meanwhile."""
        overdue, self._memory_overdue = self._memory_overdue, None
        if overdue is not None and overdue is self._held and not self._emitter.dropped:
            self._settle(None)

    # -- starting ----------------------------------------------------------------------------

    def _begin(self, seg: SegmentWork) -> None:
        """A segment to translate: its context taken, its spans found; one that is all spans
        (nothing but code, paths, ... and punctuation; no glossary term to render) is
        skipped instead."""
        seg.context = self._context.take(seg.original)
        if self._protect is not None:
            seg.protected = self._protect(seg.text)
            if seg.protected is not None and _all_spans(seg.protected):
                seg.decision = Decision("skipped", seg.decision.source_lang, None)
                return
        if self._unstarted is not None:
            self._unstarted.append(seg)
        else:
            self._start(seg)

    @property
    def unstarted(self) -> int:
        """Segments cut and waiting for ``start_deferred`` (one-shot admission)."""
        return len(self._unstarted or ())

    def start_deferred(self) -> None:
        """Start every segment held back; their deadlines run from now."""
        waiting, self._unstarted = self._unstarted or [], None
        now = time.monotonic()
        for seg in waiting:
            seg.ready_at = now
            self._start(seg)
        self._emitter.start()

    def _start(self, seg: SegmentWork) -> None:
        """Queue a segment's translation; the emitter tracks its answer. The text that
        carried it is accepted, so it is never refused (admission checked the room first):
        past its deadline it goes out as `deadline` and its update follows."""
        if self._emitter.ended:
            return
        assert self.target is not None
        seg.due = seg.ready_at + self._deadline_s
        self._emitter.track(seg, self._submit(seg, self._chain))

    def drop(self) -> None:
        """Stop the held segment's wait: nothing is cut or started after this."""
        if self._held_timer is not None:
            self._held_timer.cancel()


def _all_spans(protected: Protected) -> bool:
    """Nothing to translate: no words between the spans, and no glossary term to render."""
    return not protected.has_words() and all(s.kind != "term" for s in protected.spans)
