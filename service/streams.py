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
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from service.batcher import Translation
from service.decide import Decision, decide, wants_detection
from service.detect import Detector
from service.dispatch import Dispatcher
from service.errors import (
    BackendError,
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
    EndEvent,
    SegmentEvent,
    SegmentResult,
    SegmentUpdate,
    Status,
    StreamEnd,
    TextResult,
    UpdateEvent,
)
from service.segmenter import Piece, Segmenter
from service.settings import Settings

log = logging.getLogger("thinktrans.streams")
_QUEUE_RETRY_S = 0.02
FEED_BATCH_CHARS = 4096

Event: TypeAlias = SegmentEvent | UpdateEvent | EndEvent


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
    timer: asyncio.TimerHandle | None = None
    retry: asyncio.TimerHandle | None = None  # waiting for room in a full queue
    late: bool = False  # emitted as `deadline`; an update is owed


class EventLog:
    """A stream's events, ids rising from 0; the last ``max_retained`` (None: all) are kept
    for SSE resume and long-poll."""

    def __init__(self, stream_id: str, max_retained: int | None) -> None:
        self.stream_id = stream_id
        self.max_retained = max_retained
        self.events: deque[Event] = deque()
        self.next_id = 0
        self._changed: asyncio.Future[None] | None = None

    def publish(self, data: SegmentResult | SegmentUpdate | StreamEnd) -> None:
        event: Event
        if isinstance(data, SegmentResult):
            event = SegmentEvent(id=self.next_id, type="segment", data=data)
        elif isinstance(data, SegmentUpdate):
            event = UpdateEvent(id=self.next_id, type="update", data=data)
        else:
            event = EndEvent(id=self.next_id, type="end", data=data)
        self.next_id += 1
        self.events.append(event)
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
        first = self.events[0].id
        if after + 1 < first:
            raise EventsGone(
                f"events {after + 1}..{first - 1} of stream {self.stream_id!r} are no longer "
                f"retained (THINKTRANS_MAX_EVENTS_RETAINED={self.max_retained}); read from "
                f"{first - 1}"
            )
        start = max(0, after + 1 - first)
        return [self.events[i] for i in range(start, len(self.events))]

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
        self.segmenter = Segmenter(settings.max_segment_chars)
        self.log = EventLog(stream_id, max_events)
        self.deadline_s = settings.deadline_ms / 1000.0
        self.last_activity = time.monotonic()
        self.next_seq = 0
        self.digests: list[int] = []  # hash of each accepted chunk, by seq
        self.held: dict[int, str] = {}
        self.held_chars = 0
        self._unfed: list[str] = []  # accepted in this request, not yet fed
        self._unfed_chars = 0
        self.segments: list[_Segment] = []
        self.head = 0  # the first segment not yet emitted
        self.owed_updates = 0
        self.recent_lang: str | None = None
        self.closed = False
        self.ended = False
        self.dropped = False
        self.idle_timer: asyncio.TimerHandle | None = None
        # One-shot: segments are cut first and started together, after admission.
        self._unstarted: list[_Segment] | None = [] if deferred else None
        self._all_out: asyncio.Future[None] | None = None
        self._context_max = (settings.context_max_chars
                             if manager.dispatcher.uses_context(chain) else 0)
        self._context: deque[str] = deque()
        self._context_chars = 0

    # -- chunks --------------------------------------------------------------------------

    def add_chunks(self, chunks: Sequence[tuple[int, str]]) -> int:
        """Accept chunks by seq; return the highest seq accepted without a gap."""
        if self.closed:
            raise Conflict(f"stream {self.stream_id!r} is closed; open a new stream")
        self.manager.dispatcher.check_not_full(self.chain)
        try:
            self._add_chunks(chunks)
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
        return self.next_seq - 1

    def _add_chunks(self, chunks: Sequence[tuple[int, str]]) -> None:
        try:
            for seq, text in chunks:
                if self._take_chunk(seq, text):
                    while self.next_seq in self.held:
                        held = self.held.pop(self.next_seq)
                        self.held_chars -= len(held)
                        self._accept_seq(held)
        finally:
            self._feed_unfed()

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
        if self._unfed_chars >= FEED_BATCH_CHARS:
            self._feed_unfed()

    def _feed_unfed(self) -> None:
        if self._unfed:
            text = "".join(self._unfed)
            self._unfed.clear()
            self._unfed_chars = 0
            self.feed(text)

    def feed(self, text: str) -> None:
        """Add text in order (a one-shot text is fed this way, without seqs)."""
        for piece in self.segmenter.feed(text):
            self._add_segment(piece)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    # -- segments ------------------------------------------------------------------------

    def _add_segment(self, piece: Piece) -> None:
        detection = None
        prose = wants_detection(piece.text, piece.kind)
        if prose and self.source is None:
            detection = self.manager.detector.detect(piece.text)
            if detection.reliable and detection.lang:
                self.recent_lang = detection.lang
        decision = decide(prose, target=self.target, detection=detection,
                          fallback_lang=self.recent_lang, source=self.source)
        seg = _Segment(len(self.segments), piece, decision, time.monotonic())
        self.segments.append(seg)
        if decision.status is None:
            seg.context = self._take_context(piece.text)
            if self._unstarted is not None:
                self._unstarted.append(seg)
            else:
                self._start(seg)
        self._advance()

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
            self._start(seg)

    def _start(self, seg: _Segment) -> None:
        self._submit(seg)
        self._arm_deadline(seg)

    def _submit(self, seg: _Segment) -> None:
        """Queue a segment's translation; while the queue is full, try again shortly.

        The text that carried it is already accepted, so the segment is never dropped:
        past its deadline it goes out as `deadline` and its update follows.
        """
        seg.retry = None
        if self.ended:
            return
        assert self.target is not None
        try:
            seg.task = self.manager.dispatcher.submit(
                seg.piece.text.strip(), seg.decision.send_source, self.target, self.chain,
                seg.context)
        except Overloaded:
            seg.retry = asyncio.get_running_loop().call_later(
                _QUEUE_RETRY_S, self._submit, seg)
            return
        seg.task.add_done_callback(functools.partial(self._on_task_done, seg))

    def flush(self, *, final: bool = True) -> None:
        """Make whatever text is pending a segment (idle: ``final=False``, or close)."""
        for piece in self.segmenter.flush(final=final):
            self._add_segment(piece)

    def _arm_idle_flush(self) -> None:
        if self.idle_timer is None and self.segmenter.pending:
            delay = self.manager.settings.flush_idle_ms / 1000.0
            self.idle_timer = asyncio.get_running_loop().call_later(delay, self._on_idle)

    def _on_idle(self) -> None:
        self.idle_timer = None
        if self.ended or not self.segmenter.pending:
            return
        idle_s = self.manager.settings.flush_idle_ms / 1000.0
        quiet = time.monotonic() - self.last_activity
        if quiet + 0.001 < idle_s:
            self.idle_timer = asyncio.get_running_loop().call_later(idle_s - quiet, self._on_idle)
            return
        self.flush(final=False)

    def _on_task_done(self, seg: _Segment, _task: asyncio.Future[Translation]) -> None:
        if self.dropped:
            return
        if seg.timer is not None:
            seg.timer.cancel()
            seg.timer = None
        if seg.late:
            self._emit_update(seg)
        else:
            self._advance()

    def _on_deadline(self, seg: _Segment) -> None:
        seg.timer = None
        if self.dropped:
            return
        if not self._resolvable(seg):
            # The loop's clock and ours may differ by a hair: re-arm for what is left.
            self._arm_deadline(seg)
            return
        self._advance()

    def _arm_deadline(self, seg: _Segment) -> None:
        loop = asyncio.get_running_loop()
        deadline = seg.ready_at + self.deadline_s
        seg.timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()),
                                 self._on_deadline, seg)

    def _resolvable(self, seg: _Segment) -> bool:
        if seg.decision.status is not None or (seg.task is not None and seg.task.done()):
            return True
        if self._unstarted is not None:
            return False  # not started yet: its deadline has not begun
        return time.monotonic() >= seg.ready_at + self.deadline_s - 0.0005

    # -- emitting ------------------------------------------------------------------------

    def _advance(self) -> None:
        """Emit, in order, every segment from the head that can go out now."""
        while self.head < len(self.segments):
            seg = self.segments[self.head]
            if not self._resolvable(seg):
                break
            result = self._result(seg)
            if result.status == "deadline":
                seg.late = True
                self.owed_updates += 1
            self.head += 1
            self.log.publish(result)
        self._maybe_end()

    def _result(self, seg: _Segment, unfinished: Status = "deadline",
                reason: str | None = None) -> SegmentResult:
        """A segment's result from its decision and (finished or not) translation."""
        latency_ms = (time.monotonic() - seg.ready_at) * 1000.0
        original = seg.piece.text
        status: Status
        text, backend, error, queued_ms = original, None, None, 0.0
        task = seg.task
        if seg.decision.status is not None:
            status = seg.decision.status
        elif task is None or not task.done() or task.cancelled():
            # Not back yet: normally its deadline (an update follows); at shutdown, an error.
            status, error = unfinished, reason
        elif (exc := task.exception()) is not None:
            status, error = "error", _reason(exc)
        else:
            tr = task.result()
            status, backend, queued_ms = "translated", tr.backend, tr.queued_ms
            text = keep_whitespace(original, tr.text)
        result = SegmentResult(
            index=seg.index, original=original, text=text,
            source_lang=seg.decision.source_lang, target=self.target, status=status,
            backend=backend, queued_ms=round(queued_ms, 3), latency_ms=round(latency_ms, 3),
            **({"error": error} if error is not None else {}),
        )
        self.manager.count(result)
        return result

    def _emit_update(self, seg: _Segment) -> None:
        task = seg.task
        assert task is not None
        seg.late = False
        self.owed_updates -= 1
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
                                   status="translated", backend=tr.backend)
        self.log.publish(update)
        self._maybe_end()

    def _maybe_end(self) -> None:
        if not self.closed or self.head < len(self.segments):
            return
        if self._all_out is not None and not self._all_out.done():
            self._all_out.set_result(None)
        if not self.ended and self.owed_updates == 0:
            self.ended = True
            self.log.publish(StreamEnd(segments=len(self.segments)))
            self.manager.on_end(self)

    async def wait_emitted(self) -> None:
        """Return once the stream is closed and every segment is out (not the updates)."""
        if self.dropped or (self.closed and self.head == len(self.segments)):
            return
        if self._all_out is None:
            self._all_out = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._all_out)

    def text_result(self) -> TextResult:
        """Every segment out so far, joined: a one-shot request's answer."""
        segments = [event.data for event in self.log.events if isinstance(event, SegmentEvent)]
        return TextResult(text="".join(s.text for s in segments), segments=segments)

    async def wait_events(self, after: int, timeout_s: float) -> list[Event]:
        return await self.log.wait(after, timeout_s, ended=self.ended)

    # -- end of life -----------------------------------------------------------------------

    def close(self) -> int:
        if self.held:
            raise Conflict(
                f"stream {self.stream_id!r} is missing seq {self.next_seq} before the "
                f"{len(self.held)} held chunks; send it, then close", missing_seq=self.next_seq,
            )
        if not self.closed:
            self.flush()
            self.closed = True
            self._maybe_end()
        self.touch()
        return len(self.segments)

    def abort(self, reason: str) -> None:
        """Shutdown past its grace: every segment not out goes out now with its original
        (status error), every owed update as an error, then `end`; then drop the work."""
        if self.ended:
            return
        for seg in self.segments[self.head:]:
            self.log.publish(self._result(seg, unfinished="error", reason=reason))
        self.head = len(self.segments)
        for seg in self.segments:
            if seg.late:
                seg.late = False
                self.owed_updates -= 1
                self.log.publish(SegmentUpdate(index=seg.index, text=seg.piece.text,
                                               status="error", backend=None, error=reason))
        self.ended = True
        self.log.publish(StreamEnd(segments=len(self.segments)))
        self.drop()

    def drop(self) -> None:
        """Cancel timers and work; wake readers. Nothing is emitted after this."""
        self.dropped = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        for seg in self.segments:
            for handle in (seg.timer, seg.retry):
                if handle is not None:
                    handle.cancel()
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
        if stream.stream_id in self.streams:
            self._gauge()

    def active(self) -> int:
        """Streams not yet ended; an ended one is kept only for late readers."""
        return sum(1 for s in self.streams.values() if not s.ended)

    def _gauge(self) -> None:
        self.metrics.open_streams.set(self.active())

    # -- one-shot ------------------------------------------------------------------------

    def oneshot(self, target: ResolvedTarget, chain: list[str], source: str | None) -> Stream:
        """An unnamed stream for one text of a one-shot request: fed once, then closed."""
        return Stream("-", self, target=target, chain=chain, source=source, deferred=True)

    # -- named streams -----------------------------------------------------------------------

    def open(self, stream_id: str, target: str | None, backend: str | None,
             user_text: str | None = None) -> tuple[Stream, bool]:
        """Open a stream, or return the one already open with the same target."""
        if user_text is not None:
            check_encodable(user_text, "user_text")
        resolved = self.resolve(target, user_text)
        existing = self.streams.get(stream_id)
        if existing is not None:
            if existing.target != resolved.target or existing.backend_name != backend:
                raise Conflict(
                    f"stream {stream_id!r} is already open with target {existing.target!r} "
                    f"and backend {existing.backend_name!r}"
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
                        max_events=self.settings.max_events_retained)
        self.streams[stream_id] = stream
        self._gauge()
        return stream, True

    def add_chunks(self, stream_id: str, chunks: Sequence[tuple[int, str]]) -> int:
        """Accept chunks for a stream (opened with the default target if it is new)."""
        check_chunks(self.settings, [text for _, text in chunks])
        stream = self.streams.get(stream_id)
        if stream is None:
            stream, _ = self.open(stream_id, None, None)
        return stream.add_chunks(chunks)

    def get(self, stream_id: str) -> Stream:
        stream = self.streams.get(stream_id)
        if stream is None:
            raise NotFound(f"no stream {stream_id!r}: it was never opened, was deleted, or "
                           "expired after THINKTRANS_STREAM_IDLE_EXPIRE_S")
        return stream

    def delete(self, stream_id: str) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            raise NotFound(f"no stream {stream_id!r}")
        stream.drop()
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
                                              "segments": len(stream.segments)})
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
                stream.close()
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
