"""Streams: the one data path, for streamed thinking and one-shot texts alike.

A ``Stream`` is one thinking part (or one one-shot text, fed once and closed), composed
of the parts that each do one job:

- ``service/stream/intake.py``: chunks by seq into text in order (gaps, retries, the buffer
  bound, one request at a time);
- ``service/stream/admission.py``: whether the chain's queues have room for the text, before a
  chunk is taken;
- ``service/stream/cutting.py``: the text into segments, each detected, decided and started
  down the chain (pacing, the stream's language memory, context);
- ``service/stream/emission.py``: the segments out in order by their deadlines, late updates
  and ``end``, into the stream's ``EventLog``, which SSE and long-poll read.

The ``StreamManager`` owns every stream of a runtime: it opens, feeds, expires, drains
and forgets them, and keeps ended ones for late readers within bounds.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from models.spans import Glossary, Protected, SpanFinder
from service.chain.dispatch import Dispatcher
from service.exceptions import (
    Conflict,
    EventsGone,
    NotFound,
    Overloaded,
    ThinktransError,
    TooManyStreams,
)
from service.ops.metrics import Metrics
from service.schemas import Policy, TextResult
from service.settings import Settings
from service.stream.admission import Admission
from service.stream.counters import StreamCounters
from service.stream.cutting import FEED_BATCH_CHARS, Cutter, Pacer, Submit
from service.stream.emission import Emitter, Event, EventLog
from service.stream.intake import ChunkIntake
from service.stream.preview import PreviewConfig, Previewer, StartPreview
from service.text.detect import Detector
from service.text.glossary import GlossaryBook
from service.text.limits import check_chunks, check_encodable
from service.text.segmenter import Segmenter
from service.text.tags import ResolvedTarget, resolve_target

log = logging.getLogger("thinktrans.streams")
# Evicted ended streams remembered (for 410 instead of 404), oldest forgotten first.
_GONE_REMEMBERED = 4096


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """The settings a stream runs by."""

    deadline_ms: float
    max_segment_chars: int
    max_fence_chars: int
    max_gap: int
    max_stream_buffer_chars: int
    flush_idle_ms: float
    stream_memory_wait_ms: float
    context_max_chars: int

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamConfig:
        return cls(
            deadline_ms=settings.deadline_ms, max_segment_chars=settings.max_segment_chars,
            max_fence_chars=settings.max_fence_chars, max_gap=settings.max_gap,
            max_stream_buffer_chars=settings.max_stream_buffer_chars,
            flush_idle_ms=settings.flush_idle_ms,
            stream_memory_wait_ms=settings.stream_memory_wait_ms,
            context_max_chars=settings.context_max_chars,
        )


class Stream:
    """One thinking part (or one one-shot text): its intake, admission, cutting and
    emission, composed.

    ``submit`` starts a segment down the chain; ``counters`` counts what its parts do
    (results out, segments the stream's memory settled, previews); ``on_end`` is told
    once the stream's ``end`` is out.
    """

    def __init__(
        self,
        stream_id: str,
        config: StreamConfig,
        *,
        target: ResolvedTarget,
        chain: list[str],
        detector: Detector,
        submit: Submit,
        admission: Admission,
        counters: StreamCounters,
        on_end: Callable[[Stream], None],
        backend_name: str | None = None,
        source: str | None = None,
        model: str | None = None,
        policy: Policy = "translate",
        uses_context: bool = False,
        max_events: int | None = None,
        deferred: bool = False,
        release: Callable[[], None] | None = None,
        glossary: Glossary | None = None,
        protect: Callable[[str], Protected | None] | None = None,
        previews: tuple[PreviewConfig, StartPreview] | None = None,
    ) -> None:
        self.stream_id = stream_id
        # Called once, when the stream ends or is dropped: its model may be evicted then.
        self._release = release
        self.target = target.target
        self.target_source = target.source
        self.chain = chain
        self.backend_name = backend_name
        self.model = model  # the model it named for its chain's backends (None: theirs)
        self.policy: Policy = policy
        self.glossary = glossary  # the glossary it runs with (the file's and its own)
        self.previews = previews is not None  # its open sentence previewed
        self.started_at = time.time()  # wall clock, for GET /v1/streams
        self.last_activity = time.monotonic()
        self.idle_timer: asyncio.TimerHandle | None = None
        self._idle_s = config.flush_idle_ms / 1000.0
        self._on_end = on_end
        self._pacer = Pacer()  # the current request's
        deadline_s = config.deadline_ms / 1000.0
        segmenter = Segmenter(config.max_segment_chars, max_fence_chars=config.max_fence_chars)
        self.log = EventLog(stream_id, max_events, keep_results=deferred)
        self.emitter = Emitter(self.log, target=self.target, deadline_s=deadline_s,
                               counters=counters, on_end=self._ended, deferred=deferred)
        self.cutter = Cutter(
            segmenter, detector, self.emitter, submit, chain=chain, target=self.target,
            source=source, model=model, policy=policy, deadline_s=deadline_s,
            memory_wait_s=config.stream_memory_wait_ms / 1000.0,
            context_max_chars=config.context_max_chars if uses_context else 0,
            cut=admission.cut, counters=counters, busy=self._busy, deferred=deferred,
            protect=protect,
        )
        self.intake = ChunkIntake(stream_id, max_gap=config.max_gap,
                                  max_buffer_chars=config.max_stream_buffer_chars,
                                  accepted=admission.accepted,
                                  pending=self.cutter.pending_chars)
        self._admission = admission.stream(chain, self.cutter.pending_chars, self._feed_unfed)
        # Previews of the open sentence (``service/stream/preview.py``): (config, start).
        self.previewer: Previewer | None = None
        if previews is not None and not deferred:
            preview_config, start = previews
            self.previewer = Previewer(
                preview_config, self.emitter, pending=self.cutter.pending,
                work=self.cutter.preview_work, start=start, counters=counters)
            self.emitter.on_cut = self.previewer.cut

    # -- what the parts say --------------------------------------------------------------

    @property
    def count(self) -> int:
        """Segments cut so far."""
        return self.emitter.count

    @property
    def closed(self) -> bool:
        return self.emitter.closed

    @property
    def ended(self) -> bool:
        return self.emitter.ended

    @property
    def dropped(self) -> bool:
        return self.emitter.dropped

    @property
    def owed_updates(self) -> int:
        return self.emitter.owed_updates

    @property
    def unstarted(self) -> int:
        """Segments cut and waiting for ``start_deferred`` (one-shot admission)."""
        return self.cutter.unstarted

    # -- chunks --------------------------------------------------------------------------

    async def add_chunks(self, chunks: Sequence[tuple[int, str]]) -> int:
        """Accept chunks by seq; return the highest seq accepted without a gap.

        A chunk is accepted only while the chain's queues have room; the first one that
        finds them full ends the request with 503, and ``accepted_through`` says exactly
        which seqs were taken (the client resends from the next one).
        """
        intake = self.intake
        async with intake.lock:
            if self.emitter.closed:
                raise Conflict(f"stream {self.stream_id!r} is closed; open a new stream")
            if self.emitter.dropped:
                raise NotFound(f"stream {self.stream_id!r} was deleted")
            self._pacer = Pacer()
            self._admission.look_again()  # the room is looked up at the first chunk
            try:
                await self._add_chunks(chunks)
            except ThinktransError as exc:
                # Chunks before the refused one stay accepted: say how far, so the client
                # resends from there.
                exc.extra.setdefault("accepted_through", intake.next_seq - 1)
                raise
            finally:
                # Even when a later chunk of the request is refused, the ones accepted
                # before it are in: they must be flushed when the stream goes idle.
                self.touch()
                self._arm_idle_flush()
                self.cutter.settle_overdue()
                if self.previewer is not None:
                    self.previewer.poke()
            return intake.next_seq - 1

    async def _add_chunks(self, chunks: Sequence[tuple[int, str]]) -> None:
        intake, admission = self.intake, self._admission
        try:
            for seq, text in chunks:
                if seq == intake.next_seq and not admission.take(len(text)):
                    await admission.make_room(len(text), seq)
                if intake.take(seq, text) and intake.unfed_chars >= FEED_BATCH_CHARS:
                    await self._feed_unfed()
                    admission.look_again()  # others may have taken places meanwhile
        finally:
            await self._feed_unfed()

    async def _feed_unfed(self) -> None:
        if self.intake.unfed:
            await self.cutter.feed(self.intake.take_unfed(), self._pacer, counted=True)

    async def feed(self, text: str, pacer: Pacer) -> None:
        """Add text in order (a one-shot text is fed this way, without seqs), paced by the
        request's ``pacer``."""
        await self.cutter.feed(text, pacer, counted=False)

    def start_deferred(self) -> None:
        """Start every segment held back; their deadlines run from now."""
        self.cutter.start_deferred()

    def flush(self, *, final: bool = True) -> None:
        """Make whatever text is pending a segment (idle: ``final=False``, or close)."""
        self.cutter.flush(final=final)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def summary(self, now: float, clock: float) -> dict[str, Any]:
        """What ``GET /v1/streams`` says of it (a ``StreamSummary``), no text; ``now`` and
        ``clock``: the wall clock and the monotonic one, read once for every stream."""
        return {"stream_id": self.stream_id, "target": self.target,
                "state": "ended" if self.emitter.ended else "open",
                "segments": self.emitter.count, "started": _rfc3339(self.started_at),
                "last_active": _rfc3339(now - (clock - self.last_activity))}

    def _busy(self) -> bool:
        """Whether a request is taking chunks (or closing) now."""
        return self.intake.lock.locked()

    def _arm_idle_flush(self) -> None:
        if self.idle_timer is None and self.cutter.segmenter.pending:
            self.idle_timer = asyncio.get_running_loop().call_later(self._idle_s, self._on_idle)

    def _on_idle(self) -> None:
        self.idle_timer = None
        if self.emitter.ended or not self.cutter.segmenter.pending or self.intake.lock.locked():
            return  # a request cutting this stream now re-arms it when it is done
        quiet = time.monotonic() - self.last_activity
        if quiet + 0.001 < self._idle_s:
            self.idle_timer = asyncio.get_running_loop().call_later(
                self._idle_s - quiet, self._on_idle)
            return
        self.cutter.flush(final=False)

    # -- events --------------------------------------------------------------------------

    async def wait_emitted(self) -> None:
        """Return once the stream is closed and every segment is out (not the updates)."""
        await self.emitter.wait_emitted()

    def text_result(self) -> TextResult:
        """Every segment out so far, joined: a one-shot request's answer."""
        segments = self.log.results or []
        return TextResult(text="".join(s.text for s in segments), segments=segments)

    async def wait_events(self, after: int, timeout_s: float, *,
                          shared_timeout: bool = False) -> list[Event]:
        return await self.log.wait(after, timeout_s, ended=self.emitter.ended,
                                   shared_timeout=shared_timeout)

    # -- end of life -----------------------------------------------------------------------

    async def close(self) -> int:
        """Flush the last segment and close; waits for a request still cutting this stream."""
        async with self.intake.lock:
            self.intake.check_complete()
            if not self.emitter.closed:
                self.cutter.flush()
                self.emitter.close()
            self.touch()
            return self.emitter.count

    def _ended(self) -> None:
        self.intake.forget()  # a closed stream takes no chunks: only its events are kept
        self._release_model()
        self._on_end(self)

    def _release_model(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def abort(self, reason: str) -> None:
        """Shutdown past its grace: every segment not out goes out now with its original
        (status error), every owed update as an error, then `end`; then drop the work."""
        if self.emitter.ended:
            return
        self.emitter.abort(reason)
        self.drop()

    def drop(self) -> None:
        """Cancel timers and work; wake readers. Nothing is emitted after this."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self._release_model()
        self.cutter.drop()
        if self.previewer is not None:
            self.previewer.drop()
        self.emitter.drop()


def _started(stream: Stream) -> float:
    return stream.started_at


def _rfc3339(wall: float) -> str:
    """A wall-clock time as RFC 3339 in UTC, to the millisecond."""
    t = time.gmtime(wall)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (  # noqa: UP031 (a third of f-string's cost)
        t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, int(wall * 1000) % 1000)


class StreamManager:
    """Every open stream of one runtime; opens, feeds, expires and drains them."""

    def __init__(
        self, settings: Settings, detector: Detector, dispatcher: Dispatcher,
        admission: Admission, metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.config = StreamConfig.from_settings(settings)
        self.preview_config = PreviewConfig.from_settings(settings)
        # Protected spans are found once per segment, before its chain (models/spans.py).
        self.finder = (SpanFinder(settings.span_patterns, settings.span_kinds or None)
                       if settings.protect_spans else SpanFinder(kinds=()))
        self.glossaries = GlossaryBook(settings)
        self.detector = detector
        self.dispatcher = dispatcher
        self.admission = admission
        self.metrics = metrics
        self.counters = StreamCounters(metrics)  # what every stream's parts count
        self.streams: dict[str, Stream] = {}
        # Ended streams still kept for late readers, oldest first, with their estimated
        # bytes; and the ids of ones evicted to bound them (read: 410, not 404).
        self._ended: OrderedDict[str, int] = OrderedDict()
        self._ended_bytes = 0
        self._evicted: OrderedDict[str, None] = OrderedDict()
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

    def _new(self, stream_id: str, target: ResolvedTarget, chain: list[str], *,
             policy: Policy, model: str | None, backend_name: str | None = None,
             source: str | None = None, max_events: int | None = None,
             deferred: bool = False, glossary: Glossary | None = None,
             previews: bool = False) -> Stream:
        """A stream on this manager's parts: its settings, detector, dispatcher, admission
        and metrics; its segments' spans found with ``glossary``; with ``previews``, its
        open sentence previewed (``service/stream/preview.py``)."""
        protect = (None if not self.settings.protect_spans and not glossary
                   else functools.partial(self.finder.find, glossary=glossary))
        previewing = None
        if previews and target.target is not None:
            start = functools.partial(self.dispatcher.preview, chain=chain,
                                      billed=self.preview_config.billed)
            previewing = (self.preview_config, start)
        stream = Stream(
            stream_id, self.config, target=target, chain=chain, detector=self.detector,
            submit=self.dispatcher.submit, admission=self.admission, counters=self.counters,
            on_end=self.on_end, backend_name=backend_name,
            source=source, model=model, policy=policy,
            uses_context=self.dispatcher.uses_context(chain), max_events=max_events,
            deferred=deferred, release=self.dispatcher.use_model(chain, model),
            glossary=glossary, protect=protect, previews=previewing,
        )
        stream.previews = previews  # asked for (a stream without a target has none to show)
        return stream

    def oneshot(self, target: ResolvedTarget, chain: list[str], source: str | None, *,
                model: str | None = None, policy: Policy | None = None,
                glossary: Glossary | None = None) -> Stream:
        """An unnamed stream for one text of a one-shot request: fed once, then closed;
        ``glossary`` as ``glossary_for`` resolved it."""
        return self._new("-", target, chain, source=source, model=model,
                         policy=policy or self.settings.policy, deferred=True,
                         glossary=glossary)

    def glossary_for(self, target: ResolvedTarget,
                     own: Mapping[str, Any] | None) -> Glossary | None:
        """The glossary a stream or request with ``target`` runs with: the glossary file's
        for it, then ``own`` (as the request gave it; 422 when it is bad)."""
        return self.glossaries.resolve(target.target, own)

    # -- named streams -----------------------------------------------------------------------

    def open(self, stream_id: str, target: str | None, backend: str | None,
             user_text: str | None = None, *, model: str | None = None,
             policy: Policy | None = None, glossary: Mapping[str, Any] | None = None,
             previews: bool | None = None) -> tuple[Stream, bool]:
        """Open a stream, or return the one already open with the same choices."""
        if user_text is not None:
            check_encodable(user_text, "user_text")
        resolved = self.resolve(target, user_text)
        policy = policy or self.settings.policy
        previews = self.settings.previews if previews is None else previews
        glossed = self.glossary_for(resolved, glossary)
        existing = self.streams.get(stream_id)
        if existing is not None:
            if (existing.target, existing.backend_name, existing.model, existing.policy) != (
                    resolved.target, backend, model, policy):
                raise Conflict(
                    f"stream {stream_id!r} is already open with target {existing.target!r}, "
                    f"backend {existing.backend_name!r}, model {existing.model!r} and policy "
                    f"{existing.policy!r}; open it with the same, or use another stream id"
                )
            if existing.glossary != glossed:
                raise Conflict(f"stream {stream_id!r} is already open with another glossary; "
                               "open it with the same, or use another stream id")
            if existing.previews != previews:
                raise Conflict(f"stream {stream_id!r} is already open with previews "
                               f"{'on' if existing.previews else 'off'}; open it with the "
                               "same, or use another stream id")
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
        stream = self._new(stream_id, resolved, chain, backend_name=backend, model=model,
                           policy=policy, max_events=self.settings.max_events_retained,
                           glossary=glossed, previews=previews)
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
        elif self.draining and stream.closed:
            # Closed by the drain, not by a client: say so, so that the client can too.
            raise Conflict(f"stream {stream_id!r} was closed because the service is shutting "
                           "down; open the stream on another instance")
        return await stream.add_chunks(chunks)

    def summaries(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The open streams and the ended ones still kept, newest first (the ``limit``
        newest), each a ``StreamSummary``'s fields."""
        streams = heapq.nlargest(limit, self.streams.values(), key=_started) if limit else (
            sorted(self.streams.values(), key=_started, reverse=True))
        now, clock = time.time(), time.monotonic()
        return [stream.summary(now, clock) for stream in streams]

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
                stream.intake.drop_held()  # a gap that was never filled cannot be flushed
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
