"""Streams: ordered, deadline-bounded translation of thinking deltas.

A stream takes chunks by seq (gaps held, retries ignored), feeds them to its own
segmenter, and starts each segment down the pipeline as soon as it is cut. Results go
out as events in segment order: a segment is emitted when its translation is back or
when its deadline (ready + ``deadline_ms``) passes, whichever comes first; a late
translation follows as an ``update``. Emission is driven by callbacks (translation done,
deadline timer), so a stream costs no task of its own.

Each event has an id rising from 0; a bounded log serves SSE resume and long-poll.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.batcher import Translation
from service.errors import (
    BackendError,
    Conflict,
    InputError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ThinktransError,
)
from service.locale import ResolvedTarget
from service.pipeline import Decision, Pipeline, keep_whitespace
from service.segmenter import Piece, Segmenter, is_translatable
from service.settings import Settings

log = logging.getLogger("thinktrans.streams")
_QUEUE_RETRY_S = 0.02


class TooManyStreams(ThinktransError):
    status = 429
    slug = "too-many-streams"
    title = "Too many streams"

    def __init__(self, detail: str, *, retry_after_s: int = 5) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class EventsGone(InputError):
    status = 410
    slug = "events-gone"
    title = "Events no longer retained"


@dataclass(eq=False)
class _Segment:
    index: int
    piece: Piece
    decision: Decision
    ready_at: float
    task: asyncio.Task[Translation] | None = None
    timer: asyncio.TimerHandle | None = None
    retry: asyncio.TimerHandle | None = None  # waiting for room in a full queue
    emitted: bool = False
    late: bool = False  # emitted as `deadline`; an update is owed


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    type: str
    data: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "data": self.data}


@dataclass(eq=False)
class Stream:
    """One thinking part: its chunks, segments and events."""

    stream_id: str
    target: str | None
    target_source: str
    chain: list[str]
    backend_name: str | None
    manager: StreamManager
    segmenter: Segmenter
    last_activity: float = field(default_factory=time.monotonic)
    next_seq: int = 0
    digests: list[int] = field(default_factory=list)  # hash of each accepted chunk, by seq
    held: dict[int, str] = field(default_factory=dict)
    held_chars: int = 0
    segments: list[_Segment] = field(default_factory=list)
    head: int = 0  # the first segment not yet emitted
    owed_updates: int = 0
    recent_lang: str | None = None
    closed: bool = False
    ended: bool = False
    dropped: bool = False
    events: deque[Event] = field(default_factory=deque)
    next_event_id: int = 0
    idle_timer: asyncio.TimerHandle | None = None
    _changed: asyncio.Future[None] | None = None

    # -- chunks --------------------------------------------------------------------------

    def add_chunks(self, chunks: Sequence[tuple[int, str]]) -> int:
        """Accept chunks by seq; return the highest seq accepted without a gap."""
        if self.closed:
            raise Conflict(f"stream {self.stream_id!r} is closed; open a new stream")
        self.manager.check_capacity(self)
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
        settings = self.manager.settings
        for seq, text in chunks:
            if seq < self.next_seq:
                if self.digests[seq] != hash(text):
                    raise Conflict(
                        f"seq {seq} was already accepted with other text; seqs are not reused",
                        seq=seq,
                    )
                continue
            if seq in self.held:
                if self.held[seq] != text:
                    raise Conflict(f"seq {seq} is held with other text", seq=seq)
                continue
            if seq > self.next_seq:
                if len(self.held) >= settings.max_gap:
                    raise Conflict(
                        f"seq {self.next_seq} is missing and {len(self.held)} later chunks are "
                        f"held (THINKTRANS_MAX_GAP={settings.max_gap}); resend from seq "
                        f"{self.next_seq}", missing_seq=self.next_seq,
                    )
                self._check_buffer(len(text))
                self.held[seq] = text
                self.held_chars += len(text)
                continue
            self._check_buffer(len(text))
            self._accept(text)
            while self.next_seq in self.held:
                held = self.held.pop(self.next_seq)
                self.held_chars -= len(held)
                self._accept(held)

    def _check_buffer(self, extra: int) -> None:
        limit = self.manager.settings.max_stream_buffer_chars
        buffered = len(self.segmenter.pending) + self.held_chars
        if buffered + extra > limit:
            raise PayloadTooLarge(
                f"stream {self.stream_id!r} would buffer {buffered + extra} characters "
                f"(THINKTRANS_MAX_STREAM_BUFFER_CHARS={limit}); fill the gap at seq "
                f"{self.next_seq} or send smaller chunks", missing_seq=self.next_seq,
            )

    def _accept(self, text: str) -> None:
        self.digests.append(hash(text))
        self.next_seq += 1
        for piece in self.segmenter.feed(text):
            self._add_segment(piece)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    # -- segments ------------------------------------------------------------------------

    def _add_segment(self, piece: Piece) -> None:
        pipeline = self.manager.pipeline
        detection = None
        if piece.kind == "text" and is_translatable(piece.text):
            detection = pipeline.detect(piece.text)
            if detection.reliable and detection.lang:
                self.recent_lang = detection.lang
        decision = pipeline.decide(piece.text, piece.kind, self.target, self.recent_lang,
                                   detection)
        seg = _Segment(len(self.segments), piece, decision, time.monotonic())
        self.segments.append(seg)
        if decision.status is None:
            self._submit(seg)
            self._arm_deadline(seg)
        self._advance()

    def _submit(self, seg: _Segment) -> None:
        """Queue a segment's translation; while the queue is full, try again shortly.

        The chunk that carried it is already accepted, so the segment is never dropped:
        past its deadline it goes out as `deadline` and its update follows.
        """
        seg.retry = None
        if self.ended:
            return
        assert self.target is not None
        try:
            seg.task = self.manager.pipeline.submit(
                seg.piece.text.strip(), seg.decision.send_source, self.target, self.chain)
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

    def _on_task_done(self, seg: _Segment, _task: asyncio.Task[Translation]) -> None:
        self._on_done(seg)

    def _on_done(self, seg: _Segment) -> None:
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
        deadline = seg.ready_at + self.manager.settings.deadline_ms / 1000.0
        seg.timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()),
                                 self._on_deadline, seg)

    def _resolvable(self, seg: _Segment) -> bool:
        if seg.decision.status is not None or (seg.task is not None and seg.task.done()):
            return True
        deadline = seg.ready_at + self.manager.settings.deadline_ms / 1000.0
        return time.monotonic() >= deadline - 0.0005

    def _advance(self) -> None:
        """Emit, in order, every segment from the head that can go out now."""
        pipeline = self.manager.pipeline
        while self.head < len(self.segments):
            seg = self.segments[self.head]
            if not self._resolvable(seg):
                break
            result = pipeline.result(seg.index, seg.piece.text, self.target, seg.decision,
                                     seg.task, seg.ready_at)
            if result["status"] == "deadline":
                seg.late = True
                self.owed_updates += 1
            seg.emitted = True
            self.head += 1
            self._publish("segment", result)
        self._maybe_end()

    def _emit_update(self, seg: _Segment) -> None:
        task = seg.task
        assert task is not None
        seg.late = False
        self.owed_updates -= 1
        if task.cancelled():
            data = {"index": seg.index, "text": seg.piece.text, "status": "error",
                    "backend": None, "error": "cancelled"}
        elif (exc := task.exception()) is not None:
            detail = exc.detail if isinstance(exc, BackendError) else type(exc).__name__
            data = {"index": seg.index, "text": seg.piece.text, "status": "error",
                    "backend": None, "error": detail}
        else:
            tr = task.result()
            data = {"index": seg.index, "text": keep_whitespace(seg.piece.text, tr.text),
                    "status": "translated", "backend": tr.backend}
        self._publish("update", data)
        self._maybe_end()

    def _maybe_end(self) -> None:
        if (self.closed and not self.ended and self.head == len(self.segments)
                and self.owed_updates == 0):
            self.ended = True
            self._publish("end", {"segments": len(self.segments)})
            self.manager._gauge()

    # -- events --------------------------------------------------------------------------

    def _publish(self, kind: str, data: dict[str, Any]) -> None:
        event = Event(self.next_event_id, kind, data)
        self.next_event_id += 1
        self.events.append(event)
        while len(self.events) > self.manager.settings.max_events_retained:
            self.events.popleft()
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._changed = None

    def events_after(self, after: int) -> list[Event]:
        """Events with id > after; raises EventsGone if some were already dropped."""
        if not self.events:
            return []
        first = self.events[0].id
        if after + 1 < first:
            raise EventsGone(
                f"events {after + 1}..{first - 1} of stream {self.stream_id!r} are no longer "
                f"retained (THINKTRANS_MAX_EVENTS_RETAINED="
                f"{self.manager.settings.max_events_retained}); read from {first - 1}"
            )
        start = max(0, after + 1 - first)
        return [self.events[i] for i in range(start, len(self.events))]

    async def wait_events(self, after: int, timeout_s: float) -> list[Event]:
        """Events after ``after``, waiting up to ``timeout_s`` for the first."""
        found = self.events_after(after)
        if found or self.ended or timeout_s <= 0:
            return found
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._changed), timeout_s)
        except TimeoutError:
            pass
        return self.events_after(after)

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
        pipeline = self.manager.pipeline
        for seg in self.segments[self.head:]:
            result = pipeline.result(seg.index, seg.piece.text, self.target, seg.decision,
                                     seg.task, seg.ready_at, unfinished="error", reason=reason)
            seg.emitted = True
            self._publish("segment", result)
        self.head = len(self.segments)
        for seg in self.segments:
            if seg.late:
                seg.late = False
                self.owed_updates -= 1
                self._publish("update", {"index": seg.index, "text": seg.piece.text,
                                         "status": "error", "backend": None, "error": reason})
        self.ended = True
        self._publish("end", {"segments": len(self.segments)})
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
        for seg in self.segments:
            if seg.task is not None and not seg.task.done():
                seg.task.cancel()
        self.ended = True
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)


class StreamManager:
    """Every open stream of one app; expires idle ones."""

    def __init__(self, settings: Settings, pipeline: Pipeline) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.streams: dict[str, Stream] = {}
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

    def active(self) -> int:
        """Streams not yet ended; an ended one is kept only for late readers."""
        return sum(1 for s in self.streams.values() if not s.ended)

    def _gauge(self) -> None:
        self.pipeline.metrics.open_streams.set(self.active())

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

    def open(self, stream_id: str, resolved: ResolvedTarget, backend: str | None) -> tuple[
            Stream, bool]:
        """Open a stream, or return the one already open with the same target."""
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
        chain = self.pipeline.chain_for(backend)
        stream = Stream(stream_id, resolved.target, resolved.source, chain, backend, self,
                        Segmenter(self.settings.max_segment_chars))
        self.streams[stream_id] = stream
        self._gauge()
        return stream, True

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

    def check_capacity(self, stream: Stream) -> None:
        """Refuse new chunks, before accepting any, while the first backend's queue is full."""
        batcher = self.pipeline.batchers.get(stream.chain[0])
        if batcher is not None and batcher.free() <= 0:
            raise Overloaded(
                f"the {stream.chain[0]!r} queue is full; nothing of this request was "
                "accepted, retry it", retry_after_s=1,
            )
