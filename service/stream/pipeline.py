"""One stream: the one data path, for streamed thinking and one-shot texts alike.

A one-shot text is a stream fed once and closed, so that the same text sent either way is
cut, decided and emitted the same. A ``Stream`` composes one part per job and holds none
of their state itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from models.spans import Glossary, Protected
from service.exceptions import Conflict, NotFound, ThinktransError
from service.schemas import Policy, TextResult
from service.settings import Settings
from service.stream.admission import Admission
from service.stream.counters import StreamCounters
from service.stream.cutting import FEED_BATCH_CHARS, Cutter, Pacer, Submit
from service.stream.emission import Emitter, Event, EventLog
from service.stream.intake import ChunkIntake
from service.stream.preview import PreviewConfig, Previewer, StartPreview
from service.text.detect import Detector
from service.text.segmenter import Segmenter
from service.text.tags import ResolvedTarget


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
        policy: Policy,
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

    async def close_held(self) -> int:
        """Close at shutdown: text held behind a gap that was never filled cannot be
        flushed, so it is dropped first."""
        self.intake.drop_held()
        return await self.close()

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

