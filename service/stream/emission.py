"""Emission: a stream's segments out in index order, by their deadlines, as events.

A reader must never wait past a segment's deadline, nor see segments out of order: a
segment goes out when its translation is back or its deadline passes, whichever comes
first, and one sent untranslated owes a later ``update``. The events are kept once, in the
stream's ``EventLog``, for any number of readers (SSE, long-poll) and late ones.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import itertools
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeAlias

from models.errors import BackendError
from service.chain.work import SegmentWork, Translation
from service.exceptions import EventsGone
from service.schemas import PreviewResult, SegmentResult, SegmentUpdate, Status, StreamEnd
from service.stream.counters import StreamCounters
from service.text.typography import is_tight, keep_whitespace

# Memory an event takes beside its JSON (the tuple, its id, the deque's slot), as
# tracemalloc measures it; with the JSON's own size, the measure behind
# THINKTRANS_MAX_ENDED_BYTES.
EVENT_OVERHEAD_BYTES = 140
# Segments one emission step sends out before it lets the loop turn.
EMIT_BATCH = 64

# An event as kept: (id, type, its data as JSON). Serialised once, when published: readers
# send the JSON as it is, and a tuple of an int and strings is cheap to keep and is left
# alone by the garbage collector, unlike the models it was made from.
Event: TypeAlias = tuple[int, str, str]
# Events whose wire form (an SSE frame) is kept for the next readers: the last ones made,
# which live readers read as they come.
_ENCODED_KEPT = 16
# Superseded events still retained are taken out once more than this many outnumber the
# rest (as the batcher compacts its queue).
_COMPACT_AFTER = 64


def _event_id(event: Event) -> int:
    return event[0]


def _reason(exc: BaseException) -> str:
    return exc.detail if isinstance(exc, BackendError) else type(exc).__name__


def _time_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class EventLog:
    """A stream's events, ids rising from 0; the last ``max_retained`` (None: all) that no
    later event supersedes are kept, for SSE resume and long-poll. Any number of readers
    read at once, each from its own cursor; a publish wakes them all."""

    def __init__(self, stream_id: str, max_retained: int | None, *,
                 keep_results: bool = False) -> None:
        self.stream_id = stream_id
        self.max_retained = max_retained
        self.events: deque[Event] = deque()
        self.next_id = 0
        # Retained ids that a later event supersedes: skipped by readers catching up.
        self._superseded: set[int] = set()
        self._lost_through = -1  # the last id dropped by retention (not superseded)
        self._gaps = False  # superseded events were taken out from among the others
        # Readers waiting for the next event, each with its own future: set together by a
        # publish; a reader that gives up (cancelled, timed out) takes only its own out.
        self._waiters: set[asyncio.Future[None]] = set()
        self._idle_timer: asyncio.TimerHandle | None = None  # SSE readers' keep-alive
        self._encoded: dict[int, bytes] = {}  # event id: its wire form, the newest few
        self._block: tuple[tuple[int, int, int], bytes] | None = None  # the last block
        # A one-shot text's answer is built from its results, kept as they are; nobody
        # reads its events.
        self.results: list[SegmentResult] | None = [] if keep_results else None

    def publish(self, data: SegmentResult | SegmentUpdate | PreviewResult | StreamEnd, *,
                supersedes: int | None = None) -> int:
        """Publish an event; its id. ``supersedes``: the id of an earlier event this one
        replaces (readers that have not read that one yet skip it)."""
        if self.results is not None:
            if isinstance(data, SegmentResult):
                self.results.append(data)
            self.next_id += 1
            return self.next_id - 1
        if isinstance(data, SegmentResult):
            kind = "segment"
        elif isinstance(data, PreviewResult):
            kind = "preview"
        else:
            kind = "update" if isinstance(data, SegmentUpdate) else "end"
        return self.append(kind, data.model_dump_json(exclude_defaults=True),
                           supersedes=supersedes)

    def append(self, kind: str, data: str, *, supersedes: int | None = None) -> int:
        """Publish an event of type ``kind`` with its JSON ``data``; its id."""
        event_id = self.next_id
        self.events.append((event_id, kind, data))
        self.next_id += 1
        if supersedes is not None and supersedes < event_id:
            self._supersede(supersedes)
        if self.max_retained is not None:
            events, superseded = self.events, self._superseded
            while len(events) - len(superseded) > self.max_retained:
                dropped = events.popleft()[0]
                if dropped in superseded:
                    superseded.discard(dropped)
                else:
                    self._lost_through = dropped
                    self._trim_front()
        self.wake()
        return event_id

    def _supersede(self, event_id: int) -> None:
        """Mark a retained event superseded (one gone already is left alone); superseded
        events at the front go at once, and all of them once they outnumber the rest
        (ids then have gaps)."""
        superseded = self._superseded
        if event_id in superseded or not self._retained(event_id):
            return
        superseded.add(event_id)
        self._trim_front()
        events = self.events
        if len(superseded) > _COMPACT_AFTER and len(superseded) > len(events) - len(superseded):
            self.events = deque(e for e in events if e[0] not in superseded)
            superseded.clear()
            self._gaps = True

    def _trim_front(self) -> None:
        """Drop superseded events at the front: no reader needs them."""
        events, superseded = self.events, self._superseded
        while superseded and events and events[0][0] in superseded:
            superseded.discard(events.popleft()[0])

    def _retained(self, event_id: int) -> bool:
        events = self.events
        if not events or not events[0][0] <= event_id <= events[-1][0]:
            return False
        if not self._gaps:
            return True
        at = bisect.bisect_left(events, event_id, key=_event_id)
        return events[at][0] == event_id

    def wake(self) -> None:
        """Wake every reader waiting for an event."""
        if self._waiters:
            waiters, self._waiters = self._waiters, set()
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def after(self, after: int) -> list[Event]:
        """Events with id > after, less the superseded ones; raises EventsGone if some
        were already dropped."""
        events = self.events
        if not events:
            return []
        if after < self._lost_through:
            first = self._lost_through + 1
            raise EventsGone(
                f"events {after + 1}..{first - 1} of stream {self.stream_id!r} are no longer "
                f"retained (THINKTRANS_MAX_EVENTS_RETAINED={self.max_retained}); read from "
                f"{first - 1}", resume_after=first - 1,
            )
        if self._gaps:  # superseded events were taken out: ids are not contiguous
            start = bisect.bisect_right(events, after, key=_event_id)
        else:
            start = max(0, after + 1 - events[0][0])
        found = [events[i] for i in range(start, len(events))]
        if self._superseded:
            found = [e for e in found if e[0] not in self._superseded]
        return found

    def encoded(self, event: Event, encode: Callable[[Event], bytes]) -> bytes:
        """``encode(event)``, made once for every reader of the event (the last
        _ENCODED_KEPT made are kept). One encoder per log: the SSE frame."""
        encoded = self._encoded
        wire = encoded.get(event[0])
        if wire is None:
            wire = encoded[event[0]] = encode(event)
            if len(encoded) > _ENCODED_KEPT:
                del encoded[next(iter(encoded))]
        return wire

    def encoded_block(self, events: list[Event], encode: Callable[[Event], bytes]) -> bytes:
        """The wire form of ``events`` (as ``after`` gives them) in one block: a reader
        writes what one wake found at once, and readers at the same place share it."""
        if len(events) == 1:
            return self.encoded(events[0], encode)
        key = (events[0][0], events[-1][0], len(events))
        if self._block is not None and self._block[0] == key:
            return self._block[1]
        block = b"".join([self.encoded(event, encode) for event in events])
        self._block = (key, block)
        return block

    def retained_bytes(self) -> int:
        """The memory the kept events hold: their JSON, the tuple and deque slot around
        each (EVENT_OVERHEAD_BYTES), and the wire forms kept."""
        total = sum(sys.getsizeof(data) for _, _, data in self.events)
        total += sum(sys.getsizeof(wire) for wire in self._encoded.values())
        return total + EVENT_OVERHEAD_BYTES * len(self.events)

    async def wait(self, after: int, timeout_s: float, *, ended: bool,
                   shared_timeout: bool = False) -> list[Event]:
        """Events after ``after``, waiting up to ``timeout_s`` for the first.

        ``shared_timeout`` (SSE readers, whose timeout is the keep-alive's): one timer for
        every such reader of the log, armed by the first to wait and firing at most
        ``timeout_s`` later for all of them, so that a reader may wake sooner, never
        later. A reader's wait costs a future and no timer: this runs for every reader
        at every event.
        """
        found = self.after(after)
        if found or ended or timeout_s <= 0:
            return found
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        timer = None
        if not shared_timeout:
            timer = loop.call_later(timeout_s, _time_up, waiter)
        elif self._idle_timer is None:
            self._idle_timer = loop.call_later(timeout_s, self._idle_due)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.discard(waiter)
        return self.after(after)

    def _idle_due(self) -> None:
        self._idle_timer = None
        self.wake()


class Emitter:
    """A stream's segments from cut to out: in index order, each by its deadline, then
    the updates owed and ``end``; into its ``EventLog``.

    Driven by callbacks (a translation done, the head's deadline timer), so a stream costs
    no task of its own.

    Each segment is the cutter's ``SegmentWork``, taken as it is; the emitter writes only
    its own fields of it (``answer``, ``late``). ``counters``: each segment result that
    goes out is counted there; ``on_end``: called once, when ``end`` is published. A
    deferred emitter (a one-shot text) starts no deadline until ``start``: its segments
    are started together, after admission.
    Previews of the sentence still open (``publish_preview``) go out as they come; the
    segment that sentence becomes supersedes them; ``on_cut`` is told of each segment cut.
    """

    def __init__(self, log: EventLog, *, target: str | None, deadline_s: float,
                 counters: StreamCounters, on_end: Callable[[], None],
                 deferred: bool = False) -> None:
        self.log = log
        self.on_cut: Callable[[int], None] | None = None  # told of each segment cut
        # The last preview event of each index not out yet: its segment supersedes it.
        self._previews: dict[int, int] = {}
        self.target = target
        self.tight = is_tight(target)  # no spaces between its sentences
        self.deadline_s = deadline_s
        self._counters = counters
        self._on_end = on_end
        self.started = not deferred  # deadlines run (a one-shot's: once admitted)
        self.count = 0  # segments taken so far
        self._waiting: deque[SegmentWork] = deque()  # taken and not out yet, in order
        self._late: dict[int, SegmentWork] = {}  # out as `deadline`, their update owed
        self.closed = False  # no segment comes after those taken
        self.ended = False
        self.dropped = False
        # One deadline timer, for the head segment: emission is in order, so no segment
        # behind it can go out first.
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_of: SegmentWork | None = None
        self._advance_soon = False
        self._all_out: asyncio.Future[None] | None = None

    # -- segments in -----------------------------------------------------------------------

    def add(self, seg: SegmentWork) -> None:
        """Take the next segment, as the cutter made it (index ``count``); ``advance`` lets
        it out when it can go. A ``held`` one waits, holding those behind it, until the
        cutter settles it."""
        assert seg.index == self.count, (seg.index, self.count)
        self.count += 1
        self._waiting.append(seg)
        if self.on_cut is not None:
            self.on_cut(seg.index)

    def publish_preview(self, preview: PreviewResult) -> bool:
        """Publish a preview of the sentence still open, superseding the one before it;
        False, and nothing published, once that sentence is a segment (or the stream is
        closed): a preview never comes after its segment."""
        if self.closed or self.dropped or preview.index < self.count:
            return False
        index = preview.index
        self._previews[index] = self.log.publish(preview, supersedes=self._previews.get(index))
        return True

    def start(self) -> None:
        """A deferred emitter's deadlines begin (its segments were started just now)."""
        self.started = True
        self.advance()  # arms the head's deadline

    def track(self, seg: SegmentWork, answer: asyncio.Future[Translation]) -> None:
        """A segment was started down its chain: ``answer`` gets its translation."""
        seg.answer = answer
        answer.add_done_callback(functools.partial(self._answered, seg))

    def _answered(self, seg: SegmentWork, _answer: asyncio.Future[Translation]) -> None:
        """A segment's translation is back (or failed): it, and any behind it that can,
        go out if it is the head; a late one sends its update."""
        if self.dropped:
            return
        if seg.late:
            self._emit_update(seg)
        elif self._waiting and self._waiting[0] is seg:
            self.advance()  # a segment behind the head goes out when the head does

    def close(self) -> None:
        """No more segments come: ``end`` follows once every one is out."""
        self.closed = True
        self._maybe_end()

    # -- out, in order -----------------------------------------------------------------------

    def advance(self) -> None:
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
            self.log.publish(result, supersedes=self._previews.pop(seg.index, None)
                             if self._previews else None)
        self._maybe_end()

    def _advance_later(self) -> None:
        self._advance_soon = False
        if not self.dropped:
            self.advance()

    def _resolvable(self, seg: SegmentWork) -> bool:
        if seg.held:
            return False  # settled within half its deadline, by the next segment or a timer
        if seg.decision.status is not None or (seg.answer is not None and seg.answer.done()):
            return True
        if not self.started:
            return False  # not started yet: its deadline has not begun
        return time.monotonic() >= seg.ready_at + self.deadline_s - 0.0005

    def _arm_deadline(self, head: SegmentWork) -> None:
        """The stream's one deadline timer, set for its head segment."""
        if self._deadline_of is head or not self.started:
            return  # armed already; or not started: its deadline has not begun
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        loop = asyncio.get_running_loop()
        deadline = head.ready_at + self.deadline_s
        self._deadline_of = head
        self._deadline_timer = loop.call_at(
            loop.time() + max(0.0, deadline - time.monotonic()), self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_timer = self._deadline_of = None
        if not self.dropped:
            self.advance()  # re-arms, should the loop's clock be a hair early

    def _result(self, seg: SegmentWork, unfinished: Status = "deadline",
                reason: str | None = None) -> SegmentResult:
        """A segment's result from its decision and (finished or not) translation."""
        latency_ms = (time.monotonic() - seg.ready_at) * 1000.0
        original = seg.original
        status: Status
        text, backend, error, queued_ms = original, None, None, 0.0
        model, cached = None, False
        task = seg.answer
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
            text = keep_whitespace(original, tr.text, tight=self.tight)
            model, cached = tr.model, tr.cached
        result = SegmentResult(
            index=seg.index, original=original, text=text,
            source_lang=seg.decision.source_lang, target=self.target, status=status,
            backend=backend, queued_ms=round(queued_ms, 3), latency_ms=round(latency_ms, 3),
            error=error, model=model, cached=cached,  # left out of the JSON when unset
        )
        self._counters.segment(result)
        return result

    def _emit_update(self, seg: SegmentWork) -> None:
        task = seg.answer
        assert task is not None
        seg.late = False
        del self._late[seg.index]
        original = seg.original
        update: SegmentUpdate
        if task.cancelled():
            update = SegmentUpdate(index=seg.index, text=original, status="error",
                                   backend=None, error="cancelled")
        elif (exc := task.exception()) is not None:
            update = SegmentUpdate(index=seg.index, text=original, status="error",
                                   backend=None, error=_reason(exc))
        else:
            tr = task.result()
            text = keep_whitespace(original, tr.text, tight=self.tight)
            update = SegmentUpdate(index=seg.index, text=text,
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
            self._on_end()

    # -- what readers ask ----------------------------------------------------------------------

    @property
    def owed_updates(self) -> int:
        return len(self._late)

    async def wait_emitted(self) -> None:
        """Return once closed and every segment is out (not the updates)."""
        if self.dropped or (self.closed and not self._waiting):
            return
        if self._all_out is None:
            self._all_out = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._all_out)

    # -- end of life -------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Shutdown past its grace: every segment not out goes out now with its original
        (status error), every owed update as an error, then `end`; then drop the work."""
        if self.ended:
            return
        waiting, self._waiting = self._waiting, deque()
        for seg in waiting:
            self.log.publish(self._result(seg, unfinished="error", reason=reason),
                             supersedes=self._previews.pop(seg.index, None))
        late, self._late = self._late, {}
        for seg in late.values():
            seg.late = False
            self.log.publish(SegmentUpdate(index=seg.index, text=seg.original,
                                           status="error", backend=None, error=reason))
        self.ended = True
        self.log.publish(StreamEnd(segments=self.count))
        self.drop(waiting + deque(late.values()))

    def drop(self, segments: Iterable[SegmentWork] = ()) -> None:
        """Cancel the deadline timer and the work (of ``segments`` too: ones taken out
        already); wake readers. Nothing is emitted after this."""
        self.dropped = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        for seg in itertools.chain(segments, self._waiting, self._late.values()):
            if seg.answer is not None and not seg.answer.done():
                seg.answer.cancel()
        self.ended = True
        if self._all_out is not None and not self._all_out.done():
            self._all_out.set_result(None)
        self.log.wake()
