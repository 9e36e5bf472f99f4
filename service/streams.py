"""Streams: the one data path, for streamed thinking and one-shot texts alike.

A ``Stream`` takes text (chunks by seq from HTTP, or a one-shot text fed once and
closed), cuts it into segments with its own segmenter, detects and decides each segment,
and starts it down its backend chain the moment it is cut. Results go out as events in
segment order: a segment is emitted when its translation is back or when its deadline
(ready + ``deadline_ms``) passes, whichever comes first; a late translation follows as an
``update``. Emission is driven by callbacks (translation done, deadline timer), so a
stream costs no task of its own.

Each stream writes its events to an ``EventLog`` (ids rising from 0), which SSE and
long-poll read; a one-shot request reads its segments from the same log.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from models.errors import BackendError
from service.batcher import Translation
from service.decide import Decision, decide, leans_on_memory, settled_memory, wants_detection
from service.detect import Detection, Detector
from service.dispatch import Dispatcher
from service.errors import (
    Conflict,
    EventsGone,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ThinktransError,
    TooManyStreams,
)
from service.limits import check_chunks, check_encodable
from service.locale import ResolvedTarget, resolve_target
from service.metrics import Metrics
from service.schemas import (
    Policy,
    SegmentResult,
    SegmentUpdate,
    Status,
    StreamEnd,
    TextResult,
)
from service.segmenter import Piece, Segmenter
from service.settings import Settings

log = logging.getLogger("thinktrans.streams")
FEED_BATCH_CHARS = 4096
# Cutting and detecting a large request gives the event loop back this often, so that
# other streams' deadlines and /healthz never wait long behind it.
YIELD_EVERY_S = 0.01
# Memory an event takes beside its JSON (the tuple, its id, the deque's slot), as
# tracemalloc measures it; with the JSON's own size, the measure behind
# THINKTRANS_MAX_ENDED_BYTES.
EVENT_OVERHEAD_BYTES = 140
# Segments one emission step sends out before it lets the loop turn.
EMIT_BATCH = 64
# Evicted ended streams remembered (for 410 instead of 404), oldest forgotten first.
_GONE_REMEMBERED = 4096

# An event as kept: (id, type, its data as JSON). Serialised once, when published: readers
# send the JSON as it is, and a tuple of an int and strings is cheap to keep and is left
# alone by the garbage collector, unlike the models it was made from.
Event: TypeAlias = tuple[int, str, str]


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


def keep_whitespace(original: str, translated: str) -> str:
    """The translation with the original's leading and trailing whitespace."""
    core = original.strip()
    if not core:
        return original
    start = original.index(core[0])
    end = len(original.rstrip())
    return original[:start] + translated.strip() + original[end:]


def _reason(exc: BaseException) -> str:
    return exc.detail if isinstance(exc, BackendError) else type(exc).__name__


@dataclass(eq=False)
class _Segment:
    index: int
    piece: Piece
    decision: Decision
    ready_at: float
    context: str | None = None  # the stream's preceding text, for backends that use it
    task: asyncio.Future[Translation] | None = None
    late: bool = False  # emitted as `deadline`; an update is owed
    # Waiting for the stream's next segment to be decided (``decision`` is a placeholder):
    # its detection, and the stream's recent language when it was cut.
    held: bool = False
    detection: Detection | None = None
    memory: str | None = None


class EventLog:
    """A stream's events, ids rising from 0; the last ``max_retained`` (None: all) are kept
    for SSE resume and long-poll."""

    def __init__(self, stream_id: str, max_retained: int | None, *,
                 keep_results: bool = False) -> None:
        self.stream_id = stream_id
        self.max_retained = max_retained
        self.events: deque[Event] = deque()
        self.next_id = 0
        self._changed: asyncio.Future[None] | None = None
        # A one-shot text's answer is built from its results, kept as they are; nobody
        # reads its events.
        self.results: list[SegmentResult] | None = [] if keep_results else None

    def publish(self, data: SegmentResult | SegmentUpdate | StreamEnd) -> None:
        if self.results is not None:
            if isinstance(data, SegmentResult):
                self.results.append(data)
            self.next_id += 1
            return
        if isinstance(data, SegmentResult):
            kind = "segment"
        else:
            kind = "update" if isinstance(data, SegmentUpdate) else "end"
        self.events.append((self.next_id, kind, data.model_dump_json(exclude_defaults=True)))
        self.next_id += 1
        if self.max_retained is not None:
            while len(self.events) > self.max_retained:
                self.events.popleft()
        self.wake()

    def wake(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._changed = None

    def after(self, after: int) -> list[Event]:
        """Events with id > after; raises EventsGone if some were already dropped."""
        if not self.events:
            return []
        first = self.events[0][0]
        if after + 1 < first:
            raise EventsGone(
                f"events {after + 1}..{first - 1} of stream {self.stream_id!r} are no longer "
                f"retained (THINKTRANS_MAX_EVENTS_RETAINED={self.max_retained}); read from "
                f"{first - 1}"
            )
        start = max(0, after + 1 - first)
        return [self.events[i] for i in range(start, len(self.events))]

    def retained_bytes(self) -> int:
        """The memory the kept events hold: their JSON, and the tuple and deque slot
        around each (EVENT_OVERHEAD_BYTES)."""
        total = sum(sys.getsizeof(data) for _, _, data in self.events)
        return total + EVENT_OVERHEAD_BYTES * len(self.events)

    async def wait(self, after: int, timeout_s: float, *, ended: bool) -> list[Event]:
        """Events after ``after``, waiting up to ``timeout_s`` for the first."""
        found = self.after(after)
        if found or ended or timeout_s <= 0:
            return found
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._changed), timeout_s)
        except TimeoutError:
            pass
        return self.after(after)


class Stream:
    """One thinking part (or one one-shot text): its text, segments and events."""

    def __init__(
        self,
        stream_id: str,
        manager: StreamManager,
        *,
        target: ResolvedTarget,
        chain: list[str],
        backend_name: str | None = None,
        source: str | None = None,
        model: str | None = None,
        policy: Policy = "translate",
        max_events: int | None = None,
        deferred: bool = False,
    ) -> None:
        settings = manager.settings
        self.stream_id = stream_id
        self.manager = manager
        self.target = target.target
        self.target_source = target.source
        self.chain = chain
        self.backend_name = backend_name
        self.source = source  # the request's own source language (one-shot only)
        self.model = model  # the model it named for its chain's backends (None: theirs)
        self.policy: Policy = policy
        self.segmenter = Segmenter(settings.max_segment_chars,
                                   max_fence_chars=settings.max_fence_chars)
        self.log = EventLog(stream_id, max_events, keep_results=deferred)
        self.deadline_s = settings.deadline_ms / 1000.0
        self.last_activity = time.monotonic()
        self.next_seq = 0
        self.digests: list[int] = []  # hash of each accepted chunk, by seq
        self.held: dict[int, str] = {}
        self.held_chars = 0
        self._unfed: list[str] = []  # accepted in this request, not yet fed
        self._unfed_chars = 0
        self._slack = 0  # queue places this request may still fill before room is checked
        self._lock = asyncio.Lock()  # one request at a time cuts and feeds this stream
        self._pacer = Pacer()  # the current request's
        self.count = 0  # segments cut so far
        self._waiting: deque[_Segment] = deque()  # cut and not out yet, in order
        self._late: dict[int, _Segment] = {}  # out as `deadline`, their update owed
        self.recent_lang: str | None = None
        # At most one segment waits for the next one to settle its language (memory).
        self._held: _Segment | None = None
        self._held_timer: asyncio.TimerHandle | None = None
        self._memory_wait_s = min(settings.stream_memory_wait_ms / 1000.0, self.deadline_s / 2)
        # The held segment whose wait ran out while a request held the lock.
        self._memory_overdue: _Segment | None = None
        self.closed = False
        self.ended = False
        self.dropped = False
        self.idle_timer: asyncio.TimerHandle | None = None
        # One deadline timer per stream, for the head segment: emission is in order, so
        # no segment behind it can go out first.
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_of: _Segment | None = None
        self._advance_soon = False
        # One-shot: segments are cut first and started together, after admission.
        self._unstarted: list[_Segment] | None = [] if deferred else None
        self._all_out: asyncio.Future[None] | None = None
        self._context_max = (settings.context_max_chars
                             if manager.dispatcher.uses_context(chain) else 0)
        self._context: deque[str] = deque()
        self._context_chars = 0

    # -- chunks --------------------------------------------------------------------------

    async def add_chunks(self, chunks: Sequence[tuple[int, str]]) -> int:
        """Accept chunks by seq; return the highest seq accepted without a gap.

        A chunk is accepted only while the chain's queues have room; the first one that
        finds them full ends the request with 503, and ``accepted_through`` says exactly
        which seqs were taken (the client resends from the next one).
        """
        async with self._lock:
            if self.closed:
                raise Conflict(f"stream {self.stream_id!r} is closed; open a new stream")
            if self.dropped:
                raise NotFound(f"stream {self.stream_id!r} was deleted")
            self._pacer = Pacer()
            self._slack = -1  # the room is looked up at the first chunk
            try:
                await self._add_chunks(chunks)
            except ThinktransError as exc:
                # Chunks before the refused one stay accepted: say how far, so the client
                # resends from there.
                exc.extra.setdefault("accepted_through", self.next_seq - 1)
                raise
            finally:
                # Even when a later chunk of the request is refused, the ones accepted
                # before it are in: they must be flushed when the stream goes idle.
                self.touch()
                self._arm_idle_flush()
                self._settle_overdue()
            return self.next_seq - 1

    async def _add_chunks(self, chunks: Sequence[tuple[int, str]]) -> None:
        try:
            for seq, text in chunks:
                if seq == self.next_seq:
                    await self._make_room(len(text))
                if self._take_chunk(seq, text):
                    while self.next_seq in self.held:  # held text was admitted already
                        held = self.held.pop(self.next_seq)
                        self.held_chars -= len(held)
                        self._accept_seq(held)
                    if self._unfed_chars >= FEED_BATCH_CHARS:
                        await self._feed_unfed()
                        self._slack = -1  # others may have taken places meanwhile
        finally:
            await self._feed_unfed()

    async def _make_room(self, chars: int) -> None:
        """Before accepting a chunk of ``chars`` characters: 503 while the chain's queues
        are full.

        Text accepted anywhere and not yet cut counts a place per character (no more
        segments can come of it) until it is cut. So while the queues have room for that,
        the chunk is taken at the cost of one lookup per request; near the bound this
        stream's waiting text is cut first and the room counted again, and the chunk is
        taken while any is left: the queues overshoot by at most one chunk's segments,
        whatever the number of streams."""
        self._slack -= chars
        if self._slack >= 0:
            return
        dispatcher = self.manager.dispatcher
        free = dispatcher.room(self.chain) - dispatcher.uncut - len(self.segmenter.pending)
        self._slack = free - chars
        if self._slack >= 0:
            return
        await self._feed_unfed()  # its segments take their places now
        free = dispatcher.room(self.chain) - dispatcher.uncut
        if free <= 0:
            raise Overloaded(
                f"the queue of backend {','.join(self.chain)!r} is full; the chunks through "
                f"seq {self.next_seq - 1} were accepted, resend from seq {self.next_seq} "
                "after Retry-After", retry_after_s=1,
            )
        self._slack = -1  # the next chunk looks again

    def _take_chunk(self, seq: int, text: str) -> bool:
        """Check one chunk: True when it is the next seq (accepted), else held or a retry."""
        if seq < self.next_seq:
            if self.digests[seq] != hash(text):
                raise Conflict(
                    f"seq {seq} was already accepted with other text; seqs are not reused",
                    seq=seq,
                )
            return False
        if seq in self.held:
            if self.held[seq] != text:
                raise Conflict(f"seq {seq} is held with other text", seq=seq)
            return False
        max_gap = self.manager.settings.max_gap
        if seq > self.next_seq:
            if len(self.held) >= max_gap:
                raise Conflict(
                    f"seq {self.next_seq} is missing and {len(self.held)} later chunks are "
                    f"held (THINKTRANS_MAX_GAP={max_gap}); resend from seq "
                    f"{self.next_seq}", missing_seq=self.next_seq,
                )
            self._check_buffer(len(text))
            self.held[seq] = text
            self.held_chars += len(text)
            return False
        self._check_buffer(len(text))
        self._accept_seq(text)
        return True

    def _check_buffer(self, extra: int) -> None:
        limit = self.manager.settings.max_stream_buffer_chars
        buffered = len(self.segmenter.pending) + self._unfed_chars + self.held_chars
        if buffered + extra > limit:
            raise PayloadTooLarge(
                f"stream {self.stream_id!r} would buffer {buffered + extra} characters "
                f"(THINKTRANS_MAX_STREAM_BUFFER_CHARS={limit}); fill the gap at seq "
                f"{self.next_seq} or send smaller chunks", missing_seq=self.next_seq,
            )

    def _accept_seq(self, text: str) -> None:
        self.digests.append(hash(text))
        self.next_seq += 1
        # Accepted text reaches the segmenter a request (or FEED_BATCH_CHARS) at a time:
        # it cuts the same whatever the chunking, and one call per delta costs.
        self._unfed.append(text)
        self._unfed_chars += len(text)
        self.manager.dispatcher.uncut += len(text)

    async def _feed_unfed(self) -> None:
        if self._unfed:
            text = "".join(self._unfed)
            self._unfed.clear()
            self._unfed_chars = 0
            await self._feed(text, counted=True)

    async def feed(self, text: str, pacer: Pacer) -> None:
        """Add text in order (a one-shot text is fed this way, without seqs), paced by the
        request's ``pacer``."""
        self._pacer = pacer
        await self._feed(text, counted=False)

    async def _feed(self, text: str, *, counted: bool) -> None:
        """Cut, detect and start ``text``'s segments, giving the event loop back as the
        request's pacer says: a large request never holds other streams up for long.
        ``counted``: the text is in the dispatcher's ``uncut`` until each slice is cut."""
        pacer = self._pacer
        dispatcher = self.manager.dispatcher
        left = len(text) if counted else 0  # still in dispatcher.uncut
        try:
            for start in range(0, len(text), FEED_BATCH_CHARS):
                part = text[start : start + FEED_BATCH_CHARS]
                slice_left = len(part) if counted else 0
                for piece in self.segmenter.feed(part):
                    self._add_segment(piece)
                    if slice_left:  # its characters are queued (or decided) now
                        taken = min(len(piece.text), slice_left)
                        slice_left -= taken
                        left -= taken
                        dispatcher.uncut -= taken
                    if time.monotonic() >= pacer.at:  # checked inline: no coroutine a piece
                        await pacer.pause()
                        if self.dropped:
                            return  # deleted while this request was cut: nobody reads it
                left -= slice_left  # the rest waits in the segmenter, counted by its stream
                dispatcher.uncut -= slice_left
        finally:
            dispatcher.uncut -= left

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    # -- segments ------------------------------------------------------------------------

    def _add_segment(self, piece: Piece) -> None:
        detection = None
        prose = wants_detection(piece.text, piece.kind)
        if prose and self.source is None:
            detection = self.manager.detector.detect(piece.text)
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
        seg = _Segment(self.count, piece, decision, time.monotonic())
        self.count += 1
        self._waiting.append(seg)
        if decision.status is None:
            seg.context = self._take_context(piece.text)
            self._begin(seg)
        self._advance()

    def _begin(self, seg: _Segment) -> None:
        if self._unstarted is not None:
            self._unstarted.append(seg)
        else:
            self._start(seg)

    # -- stream memory -----------------------------------------------------------------------

    def _hold(self, piece: Piece, detection: Detection) -> None:
        """Cut a segment whose language only the stream's memory can tell, and let it wait
        (at most ``_memory_wait_s``) for the next segment: see ``_settle``."""
        seg = _Segment(self.count, piece, Decision(None, detection.lang, None), time.monotonic(),
                       held=True, detection=detection, memory=self.recent_lang)
        self.count += 1
        self._waiting.append(seg)
        self._held = seg
        if self._unstarted is None:  # a one-shot text is settled when it is all cut
            self._held_timer = asyncio.get_running_loop().call_later(
                self._memory_wait_s, self._on_memory_wait)
        self._advance()

    def _settle(self, next_lang: str | None) -> None:
        """Decide the held segment: between two segments of the stream's recent language
        it is that language; before a segment reliably in another language (a switch) it
        is what its own detection says; with no clear next language (the wait ran out, a
        flush, an unclear next segment) it is the recent language, as it always was."""
        seg, self._held = self._held, None
        assert seg is not None
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        memory = settled_memory(seg.memory, next_lang)
        seg.held = False
        seg.decision = decide(True, target=self.target, detection=seg.detection,
                              fallback_lang=memory, policy=self.policy)
        self.manager.metrics.stream_memory.labels("kept" if memory else "own").inc()
        if seg.decision.status is None:
            # No segment after it has taken its context yet: it is settled first.
            seg.context = self._take_context(seg.piece.text)
            self._begin(seg)
        self._advance()

    def _on_memory_wait(self) -> None:
        self._held_timer = None
        if self._held is None or self.dropped:
            return
        if self._lock.locked():
            # A request is cutting this stream: its next segment may be in it. It settles
            # the held one, or the request's end does (``_settle_overdue``).
            self._memory_overdue = self._held
            return
        self._settle(None)

    def _settle_overdue(self) -> None:
        overdue, self._memory_overdue = self._memory_overdue, None
        if overdue is not None and overdue is self._held and not self.dropped:
            self._settle(None)

    def _take_context(self, text: str) -> str | None:
        """The text before this segment (for backends that use it), then remember it."""
        if not self._context_max:
            return None
        context = "".join(self._context) or None
        self._context.append(text)
        self._context_chars += len(text)
        while len(self._context) > 1 and self._context_chars > self._context_max:
            self._context_chars -= len(self._context.popleft())
        return context

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
            self._submit(seg)
        self._advance()  # arms the head's deadline

    def _start(self, seg: _Segment) -> None:
        self._submit(seg)

    def _submit(self, seg: _Segment) -> None:
        """Queue a segment's translation. The text that carried it is accepted, so it is
        never refused (admission checked the room first): past its deadline it goes out
        as `deadline` and its update follows."""
        if self.ended:
            return
        assert self.target is not None
        seg.task = self.manager.dispatcher.submit(
            seg.piece.text.strip(), seg.decision.send_source, self.target, self.chain,
            seg.context, self.model, due=seg.ready_at + self.deadline_s)
        seg.task.add_done_callback(functools.partial(self._on_task_done, seg))

    def flush(self, *, final: bool = True) -> None:
        """Make whatever text is pending a segment (idle: ``final=False``, or close), and
        settle a segment waiting for the next one: nothing more is coming now."""
        for piece in self.segmenter.flush(final=final):
            self._add_segment(piece)
        if self._held is not None:
            self._settle(None)

    def _arm_idle_flush(self) -> None:
        if self.idle_timer is None and self.segmenter.pending:
            delay = self.manager.settings.flush_idle_ms / 1000.0
            self.idle_timer = asyncio.get_running_loop().call_later(delay, self._on_idle)

    def _on_idle(self) -> None:
        self.idle_timer = None
        if self.ended or not self.segmenter.pending or self._lock.locked():
            return  # a request cutting this stream now re-arms it when it is done
        idle_s = self.manager.settings.flush_idle_ms / 1000.0
        quiet = time.monotonic() - self.last_activity
        if quiet + 0.001 < idle_s:
            self.idle_timer = asyncio.get_running_loop().call_later(idle_s - quiet, self._on_idle)
            return
        self.flush(final=False)

    def _on_task_done(self, seg: _Segment, _task: asyncio.Future[Translation]) -> None:
        if self.dropped:
            return
        if seg.late:
            self._emit_update(seg)
        elif self._waiting and self._waiting[0] is seg:
            self._advance()  # a segment behind the head goes out when the head does

    def _on_deadline(self) -> None:
        self._deadline_timer = self._deadline_of = None
        if not self.dropped:
            self._advance()  # re-arms, should the loop's clock be a hair early

    def _arm_deadline(self, head: _Segment) -> None:
        """The stream's one deadline timer, set for its head segment."""
        if self._deadline_of is head or self._unstarted is not None:
            return  # armed already; or not started: its deadline has not begun
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        loop = asyncio.get_running_loop()
        deadline = head.ready_at + self.deadline_s
        self._deadline_of = head
        self._deadline_timer = loop.call_at(
            loop.time() + max(0.0, deadline - time.monotonic()), self._on_deadline)

    def _advance_later(self) -> None:
        self._advance_soon = False
        if not self.dropped:
            self._advance()

    def _resolvable(self, seg: _Segment) -> bool:
        if seg.held:
            return False  # settled within half its deadline, by the next segment or a timer
        if seg.decision.status is not None or (seg.task is not None and seg.task.done()):
            return True
        if self._unstarted is not None:
            return False  # not started yet: its deadline has not begun
        return time.monotonic() >= seg.ready_at + self.deadline_s - 0.0005

    # -- emitting ------------------------------------------------------------------------

    def _advance(self) -> None:
        """Emit, in order, every segment from the head that can go out now, EMIT_BATCH at
        a time (the rest on the loop's next turn: a thousand segments due at once do not
        hold the loop); then wait for the head, by its translation or its deadline."""
        waiting = self._waiting
        emitted = 0
        while waiting:
            seg = waiting[0]
            if not self._resolvable(seg):
                if not seg.held:
                    self._arm_deadline(seg)
                break
            if emitted == EMIT_BATCH:
                if not self._advance_soon:
                    self._advance_soon = True
                    asyncio.get_running_loop().call_soon(self._advance_later)
                return
            emitted += 1
            waiting.popleft()
            result = self._result(seg)
            if result.status == "deadline":
                seg.late = True
                self._late[seg.index] = seg
            self.log.publish(result)
        self._maybe_end()

    def _result(self, seg: _Segment, unfinished: Status = "deadline",
                reason: str | None = None) -> SegmentResult:
        """A segment's result from its decision and (finished or not) translation."""
        latency_ms = (time.monotonic() - seg.ready_at) * 1000.0
        original = seg.piece.text
        status: Status
        text, backend, error, queued_ms = original, None, None, 0.0
        model, cached = None, False
        task = seg.task
        if seg.decision.status is not None:
            status = seg.decision.status
            if status == "hidden":
                text = ""
        elif task is None or not task.done() or task.cancelled():
            # Not back yet: normally its deadline (an update follows); at shutdown, an error.
            status, error = unfinished, reason
        elif (exc := task.exception()) is not None:
            status, error = "error", _reason(exc)
        else:
            tr = task.result()
            status, backend, queued_ms = "translated", tr.backend, tr.queued_ms
            text = keep_whitespace(original, tr.text)
            model, cached = tr.model, tr.cached
        result = SegmentResult(
            index=seg.index, original=original, text=text,
            source_lang=seg.decision.source_lang, target=self.target, status=status,
            backend=backend, queued_ms=round(queued_ms, 3), latency_ms=round(latency_ms, 3),
            error=error, model=model, cached=cached,  # left out of the JSON when unset
        )
        self.manager.count(result)
        return result

    def _emit_update(self, seg: _Segment) -> None:
        task = seg.task
        assert task is not None
        seg.late = False
        del self._late[seg.index]
        original = seg.piece.text
        update: SegmentUpdate
        if task.cancelled():
            update = SegmentUpdate(index=seg.index, text=original, status="error",
                                   backend=None, error="cancelled")
        elif (exc := task.exception()) is not None:
            update = SegmentUpdate(index=seg.index, text=original, status="error",
                                   backend=None, error=_reason(exc))
        else:
            tr = task.result()
            update = SegmentUpdate(index=seg.index, text=keep_whitespace(original, tr.text),
                                   status="translated", backend=tr.backend, model=tr.model,
                                   cached=tr.cached)
        self.log.publish(update)
        self._maybe_end()

    def _maybe_end(self) -> None:
        if not self.closed or self._waiting:
            return
        if self._all_out is not None and not self._all_out.done():
            self._all_out.set_result(None)
        if not self.ended and not self._late:
            self.ended = True
            self.log.publish(StreamEnd(segments=self.count))
            self.digests = []  # a closed stream takes no chunks: only its events are kept
            self.manager.on_end(self)

    @property
    def owed_updates(self) -> int:
        return len(self._late)

    async def wait_emitted(self) -> None:
        """Return once the stream is closed and every segment is out (not the updates)."""
        if self.dropped or (self.closed and not self._waiting):
            return
        if self._all_out is None:
            self._all_out = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._all_out)

    def text_result(self) -> TextResult:
        """Every segment out so far, joined: a one-shot request's answer."""
        segments = self.log.results or []
        return TextResult(text="".join(s.text for s in segments), segments=segments)

    async def wait_events(self, after: int, timeout_s: float) -> list[Event]:
        return await self.log.wait(after, timeout_s, ended=self.ended)

    # -- end of life -----------------------------------------------------------------------

    async def close(self) -> int:
        """Flush the last segment and close; waits for a request still cutting this stream."""
        async with self._lock:
            if self.held:
                raise Conflict(
                    f"stream {self.stream_id!r} is missing seq {self.next_seq} before the "
                    f"{len(self.held)} held chunks; send it, then close",
                    missing_seq=self.next_seq,
                )
            if not self.closed:
                self.flush()
                self.closed = True
                self._maybe_end()
            self.touch()
            return self.count

    def abort(self, reason: str) -> None:
        """Shutdown past its grace: every segment not out goes out now with its original
        (status error), every owed update as an error, then `end`; then drop the work."""
        if self.ended:
            return
        waiting, self._waiting = self._waiting, deque()
        for seg in waiting:
            self.log.publish(self._result(seg, unfinished="error", reason=reason))
        late, self._late = self._late, {}
        for seg in late.values():
            seg.late = False
            self.log.publish(SegmentUpdate(index=seg.index, text=seg.piece.text,
                                           status="error", backend=None, error=reason))
        self.ended = True
        self.log.publish(StreamEnd(segments=self.count))
        self.drop(waiting + deque(late.values()))

    def drop(self, segments: Iterable[_Segment] = ()) -> None:
        """Cancel timers and work (of ``segments`` too: ones taken out already); wake
        readers. Nothing is emitted after this."""
        self.dropped = True
        for timer in (self.idle_timer, self._deadline_timer, self._held_timer):
            if timer is not None:
                timer.cancel()
        for seg in itertools.chain(segments, self._waiting, self._late.values()):
            if seg.task is not None and not seg.task.done():
                seg.task.cancel()
        self.ended = True
        if self._all_out is not None and not self._all_out.done():
            self._all_out.set_result(None)
        self.log.wake()


class StreamManager:
    """Every open stream of one runtime; opens, feeds, expires and drains them."""

    def __init__(
        self, settings: Settings, detector: Detector, dispatcher: Dispatcher, metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.detector = detector
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.streams: dict[str, Stream] = {}
        # Ended streams still kept for late readers, oldest first, with their estimated
        # bytes; and the ids of ones evicted to bound them (read: 410, not 404).
        self._ended: OrderedDict[str, int] = OrderedDict()
        self._ended_bytes = 0
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._counted: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.draining = False

    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="streams:sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
        for stream in list(self.streams.values()):
            stream.drop()
        self.streams.clear()
        self._ended.clear()
        self._ended_bytes = 0
        self._gauge()

    # -- what every stream shares ------------------------------------------------------------

    def resolve(self, requested: str | None, user_text: str | None = None) -> ResolvedTarget:
        """The target, in the contract's order: request, user_text, default, none."""
        settings = self.settings
        detect: Callable[[str], str | None] = lambda text: self.detector.detect(text).lang  # noqa: E731
        return resolve_target(requested, user_text=user_text,
                              default_locale=settings.default_locale,
                              allowed=settings.allowed_locales, detect=detect)

    def count(self, result: SegmentResult) -> None:
        """Metrics for a segment that goes out."""
        key = (result.status, result.backend or "")
        children = self._counted.get(key)
        if children is None:  # label lookups take a lock: once per status and backend
            children = self._counted[key] = (self.metrics.segments.labels(*key),
                                             self.metrics.segment_seconds.labels(key[0]))
        children[0].inc()
        children[1].observe(result.latency_ms / 1000.0)
        if result.status == "deadline":
            self.metrics.deadline_misses.inc()

    def on_end(self, stream: Stream) -> None:
        """A named stream ended: keep its events for late readers, within the bounds on
        ended streams (THINKTRANS_MAX_ENDED_STREAMS and _BYTES), evicting the oldest."""
        if self.streams.get(stream.stream_id) is not stream:
            return  # a one-shot text, or dropped already
        size = stream.log.retained_bytes()
        self._ended[stream.stream_id] = size
        self._ended_bytes += size
        limits = self.settings
        while self._ended and (len(self._ended) > limits.max_ended_streams
                               or self._ended_bytes > limits.max_ended_bytes):
            oldest = next(iter(self._ended))
            self._forget(self.streams.pop(oldest))
            self._evicted[oldest] = None
            if len(self._evicted) > _GONE_REMEMBERED:
                self._evicted.popitem(last=False)
            self.metrics.streams_evicted.inc()
            log.info("ended stream evicted", extra={"stream": oldest})
        self._gauge()

    def _forget(self, stream: Stream) -> None:
        """Drop a stream taken out of ``streams``, and its place among the ended ones."""
        stream.drop()
        size = self._ended.pop(stream.stream_id, None)
        if size is not None:
            self._ended_bytes -= size

    def active(self) -> int:
        """Streams not yet ended; an ended one is kept only for late readers."""
        return len(self.streams) - len(self._ended)

    def _gauge(self) -> None:
        self.metrics.open_streams.set(self.active())
        self.metrics.ended_streams.set(len(self._ended))
        self.metrics.ended_stream_bytes.set(self._ended_bytes)

    def _gone(self, stream_id: str) -> EventsGone:
        limits = self.settings
        return EventsGone(
            f"stream {stream_id!r} ended and was evicted to bound the memory of ended "
            f"streams (THINKTRANS_MAX_ENDED_STREAMS={limits.max_ended_streams}, "
            f"THINKTRANS_MAX_ENDED_BYTES={limits.max_ended_bytes}); read ended streams "
            "sooner, or raise these limits", evicted=True,
        )

    # -- one-shot ------------------------------------------------------------------------

    def oneshot(self, target: ResolvedTarget, chain: list[str], source: str | None, *,
                model: str | None = None, policy: Policy | None = None) -> Stream:
        """An unnamed stream for one text of a one-shot request: fed once, then closed."""
        return Stream("-", self, target=target, chain=chain, source=source, model=model,
                      policy=policy or self.settings.policy, deferred=True)

    # -- named streams -----------------------------------------------------------------------

    def open(self, stream_id: str, target: str | None, backend: str | None,
             user_text: str | None = None, *, model: str | None = None,
             policy: Policy | None = None) -> tuple[Stream, bool]:
        """Open a stream, or return the one already open with the same choices."""
        if user_text is not None:
            check_encodable(user_text, "user_text")
        resolved = self.resolve(target, user_text)
        policy = policy or self.settings.policy
        existing = self.streams.get(stream_id)
        if existing is not None:
            if (existing.target, existing.backend_name, existing.model, existing.policy) != (
                    resolved.target, backend, model, policy):
                raise Conflict(
                    f"stream {stream_id!r} is already open with target {existing.target!r}, "
                    f"backend {existing.backend_name!r}, model {existing.model!r} and policy "
                    f"{existing.policy!r}; open it with the same, or use another stream id"
                )
            existing.touch()
            return existing, False
        if self.draining:
            raise Overloaded("the service is shutting down; open the stream on another "
                             "instance", retry_after_s=5)
        active = self.active()
        if active >= self.settings.max_streams:
            raise TooManyStreams(
                f"{active} streams are open (THINKTRANS_MAX_STREAMS="
                f"{self.settings.max_streams}); close finished streams or retry later"
            )
        chain = self.dispatcher.chain(backend)
        stream = Stream(stream_id, self, target=resolved, chain=chain, backend_name=backend,
                        model=model, policy=policy,
                        max_events=self.settings.max_events_retained)
        self.streams[stream_id] = stream
        self._evicted.pop(stream_id, None)  # the id names this new stream now
        self._gauge()
        return stream, True

    async def add_chunks(self, stream_id: str, chunks: Sequence[tuple[int, str]]) -> int:
        """Accept chunks for a stream (opened with the default target if it is new)."""
        check_chunks(self.settings, [text for _, text in chunks])
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id in self._evicted:
                raise self._gone(stream_id)  # ended: its chunks must not open a new one
            stream, _ = self.open(stream_id, None, None)
        return await stream.add_chunks(chunks)

    def get(self, stream_id: str) -> Stream:
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id in self._evicted:
                raise self._gone(stream_id)
            raise NotFound(f"no stream {stream_id!r}: it was never opened, was deleted, or "
                           "expired after THINKTRANS_STREAM_IDLE_EXPIRE_S")
        return stream

    def delete(self, stream_id: str) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            if stream_id in self._evicted:
                raise self._gone(stream_id)
            raise NotFound(f"no stream {stream_id!r}")
        self._forget(stream)
        self._gauge()

    # -- expiry and shutdown -------------------------------------------------------------------

    async def _sweep(self) -> None:
        interval = min(1.0, self.settings.stream_idle_expire_s / 4)
        while True:
            await asyncio.sleep(interval)
            self.expire()

    def expire(self) -> int:
        """Drop streams idle past stream_idle_expire_s; return how many."""
        cutoff = time.monotonic() - self.settings.stream_idle_expire_s
        stale = [s for s in self.streams.values() if s.last_activity < cutoff]
        for stream in stale:
            log.info("stream expired", extra={"stream": stream.stream_id,
                                              "segments": stream.count})
            self.delete(stream.stream_id)
        return len(stale)

    async def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new streams, close open ones (flushing their text), and give
        their translations ``grace_s`` to come out; then drop what is left."""
        self.draining = True
        for stream in list(self.streams.values()):
            if not stream.closed:
                stream.held.clear()  # a gap that was never filled cannot be flushed
                stream.held_chars = 0
                await stream.close()
        until = time.monotonic() + grace_s
        while time.monotonic() < until and not all(s.ended for s in self.streams.values()):
            await asyncio.sleep(0.05)
        stuck = [s for s in self.streams.values() if not s.ended]
        for stream in stuck:
            stream.abort("the service shut down before the translation came")
        if stuck:
            await asyncio.sleep(0.2)  # let SSE readers write out the last events
        for stream in self.streams.values():
            stream.drop()
        log.info("streams drained", extra={"streams": len(self.streams)})
